"""Clients that harm others by being slow (issue 14, points 6 and 7), against a real server.

``python -m bench.clients [stalled|slow-heads|both] [--readers 96] [--words 15000] ...``

Each scenario starts ``responses-ledger serve`` in its own process (scripted engine, SQLite in a
temporary directory, loopback only), runs for a bounded time and stops it.

- ``stalled``: ``--readers`` clients each POST a streamed ``store=true`` response of about 4.7 MB
  of SSE (``--words`` words of final text), read up to ``response.created`` and then read no
  more. Reported: the server's RSS (psutil) before and its peak until they are all stored, and
  MB per stalled client: the growth less the growth for as many clients that read everything
  (a server of its own; generating that many responses at once costs memory too), over the
  readers; how many of those responses completed in the store, and how many of the stalled
  connections the server closed (each client reads what is left once the responses are stored:
  a closed stream ends without ``response.completed``). With ``--resume`` the stalled clients
  resume background responses (``GET ?stream=true``) instead of reading their POST's stream.
- ``slow-heads``: the server runs with RLIMIT_NOFILE ``--fd-limit`` (256, soft and hard, as in
  the issue); ``--slow`` clients each send a request head at 1 byte/s (reconnecting when the
  server closes them, as an attacker would) while ``--requests`` normal requests are made, one
  every ``--interval`` seconds, each with a ``--timeout`` second limit. Reported: how many normal
  requests failed, their latency, and how often the slow clients were cut.

Server settings come from the environment as usual (``RESPONSES_LEDGER_SEND_BUFFER_BYTES`` ...),
so the same script measures other bounds, or an older server (``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
MODEL = "gpt-oss-bench-clients"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _command() -> str:
    local = Path(sys.executable).parent / "responses-ledger"
    found = str(local) if local.exists() else shutil.which("responses-ledger")
    if not found:
        raise SystemExit("the responses-ledger command is not installed")
    return found


def _completion(text: str) -> str:
    return f"<|channel|>final<|message|>{text}<|return|>"


@contextmanager
def _server(
    workdir: Path, turns: list[dict[str, Any]], *, fd_limit: int | None = None
) -> Iterator[tuple[str, int]]:
    script = workdir / "script.json"
    script.write_text(json.dumps({"turns": turns, "cycle": True}))
    port = _free_port()
    env = {
        **os.environ,
        "RESPONSES_LEDGER_CACHE": os.environ.get("RESPONSES_LEDGER_CACHE", str(REPO / ".cache")),
    }
    env.pop("DATABASE_URL", None)
    argv = [
        _command(),
        "serve",
        "--engine",
        "scripted",
        "--script",
        str(script),
        "--database-url",
        f"sqlite+aiosqlite:///{workdir / 'responses.db'}",
        "--port",
        str(port),
        "--served-model-name",
        MODEL,
        "--log-level",
        "warning",
    ]

    def limit_fds() -> None:
        if fd_limit is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))

    log = (workdir / "server.log").open("wb")
    proc = subprocess.Popen(
        argv,
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=limit_fds,
        start_new_session=True,
    )
    base = f"http://{HOST}:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                raise SystemExit(
                    f"the server exited ({proc.returncode}): {(workdir / 'server.log').read_text()[-2000:]}"
                )
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the server did not become ready")
            time.sleep(0.1)
        yield base, proc.pid
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=20)
        log.close()


class _Sampler:
    """The server's RSS, sampled every 0.1 s in a thread: the peak."""

    def __init__(self, pid: int) -> None:
        self._proc = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _post(body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    return (
        f"POST /v1/responses HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    ).encode() + data


def _stall(port: int, resume: bool = False) -> tuple[socket.socket, str]:
    """A streamed POST read up to its response.created event; then nothing more is read. With
    ``resume``: a background POST, then its stream resumed (``GET ?stream=true``), likewise."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(60)
    sock.connect((HOST, port))
    if resume:
        created = httpx.post(
            f"http://{HOST}:{port}/v1/responses",
            timeout=60,
            json={"model": MODEL, "input": "go", "background": True},
        ).json()
        sock.sendall(
            f"GET /v1/responses/{created['id']}?stream=true HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode()
        )
    else:
        sock.sendall(_post({"model": MODEL, "input": "go", "stream": True}))
    seen = b""
    while (
        b'"response.created"' not in seen or b"\n\n" not in seen.split(b'"response.created"', 1)[1]
    ):
        chunk = sock.recv(4096)
        if not chunk:
            raise RuntimeError(f"the stream ended before response.created: {seen[:300]!r}")
        seen += chunk
    data = seen.split(b'"response.created"', 1)[1]
    response_id = data.split(b'"id":"', 1)[1].split(b'"', 1)[0].decode()
    return sock, response_id


def _rest(sock: socket.socket, timeout: float) -> tuple[int, bool, str]:
    """What a stalled client still gets: bytes, whether its stream ended, and how."""
    sock.settimeout(timeout)
    total, tail = 0, b""
    try:
        while True:
            chunk = sock.recv(1 << 20)
            if not chunk:
                how = "eof"
                break
            total += len(chunk)
            tail = (tail + chunk)[-4096:]
    except TimeoutError:
        how = "open"
    except ConnectionResetError:
        how = "reset"
    return total, b"response.completed" in tail, how


def _read_all(base: str, out: list[int]) -> None:
    with httpx.stream(
        "POST",
        base + "/v1/responses",
        timeout=600,
        json={"model": MODEL, "input": "go", "stream": True},
    ) as r:
        out.append(sum(len(c) for c in r.iter_bytes()))


def _generate(readers: int, words: int, stall: bool, resume: bool = False) -> dict[str, Any]:
    """``readers`` streamed responses at once, their clients stalled after response.created
    (or reading everything, ``stall=False``): the server's RSS before and at its peak."""
    text = " ".join(f"word{i}" for i in range(words))
    with (
        tempfile.TemporaryDirectory() as tmp,
        _server(Path(tmp), [{"completion": _completion(text)}]) as (base, pid),
    ):
        port = int(base.rsplit(":", 1)[1])
        sizes: list[int] = []
        _read_all(base, sizes)  # a reader that reads: the stream's size, and a warm server
        time.sleep(1)
        before = psutil.Process(pid).memory_info().rss
        started = time.monotonic()
        rests: list[tuple[int, bool, str]] = []
        states: dict[str, str] = {}
        with _Sampler(pid) as sampler:
            if stall:
                clients = [_stall(port, resume) for _ in range(readers)]
                ids = [rid for _, rid in clients]
                deadline = time.monotonic() + 1800
                with httpx.Client(base_url=base, timeout=60) as http:
                    while len(states) < len(ids) and time.monotonic() < deadline:
                        for rid in ids:
                            if rid not in states:
                                status = http.get(f"/v1/responses/{rid}").json()["status"]
                                if status != "in_progress":
                                    states[rid] = status
                        time.sleep(0.5)
            else:
                threads = [
                    threading.Thread(target=_read_all, args=(base, sizes)) for _ in range(readers)
                ]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
            generated_s = time.monotonic() - started
            time.sleep(1)
        if stall:
            rests = [_rest(sock, timeout=2) for sock, _ in clients]
            for sock, _ in clients:
                sock.close()
    mib = 1024 * 1024
    return {
        "stream_mb": round(sizes[0] / 1e6, 2),
        "before": before / mib,
        "peak": sampler.peak / mib,
        "completed": sum(1 for s in states.values() if s == "completed")
        if stall
        else len(sizes) - 1,
        "closed": sum(1 for _, completed, how in rests if how != "open" and not completed),
        "generated_s": generated_s,
    }


def stalled(readers: int, words: int, resume: bool = False) -> dict[str, Any]:
    reading = _generate(readers, words, stall=False)
    stalls = _generate(readers, words, stall=True, resume=resume)
    grew_reading = reading["peak"] - reading["before"]
    grew_stalled = stalls["peak"] - stalls["before"]
    return {
        "readers": "resumed (GET ?stream=true)" if resume else "streamed POST",
        "clients": readers,
        "stream_mb": stalls["stream_mb"],
        "rss_before_mb": round(stalls["before"], 1),
        "rss_peak_mb": round(stalls["peak"], 1),
        "rss_growth_mb": round(grew_stalled, 1),
        "rss_growth_reading_clients_mb": round(grew_reading, 1),
        "mb_per_stalled_client": round((grew_stalled - grew_reading) / readers, 2),
        "completed_in_store": stalls["completed"],
        "closed_by_server": stalls["closed"],
        "generated_s": round(stalls["generated_s"], 1),
    }


async def _slow_client(port: int, stop: asyncio.Event, counts: dict[str, int]) -> None:
    head = f"GET /health HTTP/1.1\r\nHost: {HOST}\r\nX-Slow: {'a' * 200}\r\n\r\n".encode()
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(HOST, port)
        except OSError:
            counts["connect_failed"] += 1
            await asyncio.sleep(1)
            continue
        counts["connections"] += 1
        try:
            for byte in head:
                if stop.is_set() or reader.at_eof():
                    break
                writer.write(bytes([byte]))
                await writer.drain()
                try:  # 1 byte/s; an answer or a close ends this connection
                    await asyncio.wait_for(reader.read(1 << 16), timeout=1.0)
                    break
                except TimeoutError:
                    pass
        except OSError:
            pass
        finally:
            counts["closed"] += 1
            writer.close()
        await asyncio.sleep(0.1)  # and connect again


async def _slow_heads(
    base: str, slow: int, requests: int, interval: float, timeout: float
) -> dict[str, Any]:
    port = int(base.rsplit(":", 1)[1])
    stop = asyncio.Event()
    counts = {"connections": 0, "closed": 0, "connect_failed": 0}
    tasks = [asyncio.create_task(_slow_client(port, stop, counts)) for _ in range(slow)]
    await asyncio.sleep(3)  # the slow connections are open
    failures: list[str] = []
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=base, timeout=timeout) as http:

        async def one() -> None:
            start = time.monotonic()
            try:
                resp = await http.post(
                    "/v1/responses",
                    json={"model": MODEL, "input": "hello"},
                    headers={"Connection": "close"},
                )
                if resp.status_code != 200:
                    failures.append(f"HTTP {resp.status_code}")
                    return
                latencies.append(time.monotonic() - start)
            except httpx.HTTPError as exc:
                failures.append(type(exc).__name__)

        normal = []
        for _ in range(requests):
            normal.append(asyncio.create_task(one()))
            await asyncio.sleep(interval)
        await asyncio.gather(*normal)
    stop.set()
    await asyncio.gather(*tasks)
    return {
        "slow_clients": slow,
        "normal_requests": requests,
        "normal_failed": len(failures),
        "failures": sorted(set(failures)),
        "normal_p50_ms": round(statistics.median(latencies) * 1000, 1) if latencies else None,
        "normal_max_ms": round(max(latencies) * 1000, 1) if latencies else None,
        "slow_connections_made": counts["connections"],
        "slow_connect_failed": counts["connect_failed"],
    }


def slow_heads(
    slow: int, requests: int, fd_limit: int, interval: float, timeout: float
) -> dict[str, Any]:
    turns = [{"completion": _completion("Hello there.")}]
    with (
        tempfile.TemporaryDirectory() as tmp,
        _server(Path(tmp), turns, fd_limit=fd_limit) as (base, _),
    ):
        result = asyncio.run(_slow_heads(base, slow, requests, interval, timeout))
    return {"fd_limit": fd_limit, **result}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.clients", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "scenario", nargs="?", choices=["stalled", "slow-heads", "both"], default="both"
    )
    parser.add_argument("--readers", type=int, default=96)
    parser.add_argument(
        "--words",
        type=int,
        default=6_800,
        help="final text of each response (6,800: ~4.7 MB of SSE)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="stalled: the clients resume background responses instead",
    )
    parser.add_argument("--slow", type=int, default=250)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--fd-limit", type=int, default=256)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    runs: dict[str, Callable[[], dict[str, Any]]] = {
        "stalled": lambda: stalled(args.readers, args.words, args.resume),
        "slow-heads": lambda: slow_heads(
            args.slow, args.requests, args.fd_limit, args.interval, args.timeout
        ),
    }
    for name in ["stalled", "slow-heads"] if args.scenario == "both" else [args.scenario]:
        result = runs[name]()
        if args.json:
            print(json.dumps({"scenario": name, **result}))
        else:
            print(f"{name}: " + ", ".join(f"{k}={v}" for k, v in result.items()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
