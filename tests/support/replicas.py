"""Three replicas on one PostgreSQL database behind a real HAProxy, and clients that resume.

Shared by ``tests/e2e/test_replicas.py`` and ``bench/replicas.py`` (issue 15):

    with Cluster(tmp_path, script=slow_script(120), env=FAST_LEASES) as cluster:
        stream = ClientStream(cluster.url, BODY)      # streamed POST through HAProxy
        stream.start()
        owner = cluster.owners([rid])[rid]            # replica id, from ``responses.owner``
        cluster.process(cluster.replica_ids()[owner]).kill()   # kill -9 that replica
        stream.join()                                 # it resumed through HAProxy
        check_stream(stream.events)                   # 0..n, each once, one terminal

Every replica runs the same script: one slow completion that cycles, so whichever replica
generates a response (or continues it after a takeover) writes the same text, and a test knows
the final text without knowing who wrote it.

:class:`ClientStream` is the client a replica failure must not hurt: it reads a streamed POST
(or a ``GET ?stream=true`` from a given seq: a follower) and, when the stream is cut (the
connection broke, it ended without a terminal event, or an ``error`` event such as
``server_shutting_down``), resumes with ``GET /v1/responses/{id}?stream=true&starting_after=<last
seq received>`` through the balancer until the terminal event. It keeps every event it received,
duplicates included, with the time it arrived, so a check sees dups and gaps instead of a
deduplicated view. Nothing here asserts: the benchmark counts what the tests assert.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import asyncpg
import httpx

from tests.faults.outcomes import TERMINALS, parse_sse
from tests.support.haproxy import HEALTH_PATH, Balancer
from tests.support.postgres import create_database, drop_database
from tests.support.process import ServerProcess
from tests.support.server import free_port

__all__ = [
    "FAST_LEASES",
    "MODEL",
    "ClientStream",
    "Cluster",
    "final_text",
    "output_text",
    "poll_until_terminal",
    "seq_problems",
    "slow_script",
]

MODEL = "gpt-oss-process"

#: Lease settings short enough for tests (the benchmark keeps the defaults: 3 s, 1 s, 1 s).
FAST_LEASES = {
    "RESPONSES_LEDGER_LEASE_S": "1",
    "RESPONSES_LEDGER_HEARTBEAT_S": "0.25",
    "RESPONSES_LEDGER_REPAIR_INTERVAL_S": "0.1",
}

TERMINAL_STATUSES = frozenset(("completed", "incomplete", "failed", "cancelled"))


def final_text(words: int) -> str:
    return " ".join(f"w{i}" for i in range(words))


def slow_script(words: int = 120, token_delay_ms: float = 15) -> dict[str, Any]:
    """One final-channel completion of ``words`` words, repeated for every request."""
    completion = f"<|channel|>final<|message|>{final_text(words)}<|return|>"
    return {"turns": [{"completion": completion}], "token_delay_ms": token_delay_ms, "cycle": True}


def output_text(response: Mapping[str, Any]) -> str:
    """The concatenated ``output_text`` parts of a Response's message items."""
    return "".join(
        part.get("text", "")
        for item in response.get("output") or []
        if item.get("type") == "message"
        for part in item.get("content") or []
        if part.get("type") == "output_text"
    )


def _dsn(url: str) -> str:
    """asyncpg's DSN for a SQLAlchemy ``postgresql+asyncpg://`` URL."""
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


class Cluster:
    """A fresh PostgreSQL database, ``n`` replicas (``ServerProcess``) on it, and HAProxy.

    Each replica keeps its port for the cluster's life, so a restarted replica comes back where
    HAProxy expects it. ``start`` lists the replicas running at the start (the others are down
    in HAProxy until :meth:`start_replica`)."""

    def __init__(
        self,
        workdir: Path,
        *,
        script: Mapping[str, Any],
        env: Mapping[str, str] | None = None,
        n: int = 3,
        start: Sequence[int] | None = None,
        health_path: str = HEALTH_PATH,
    ) -> None:
        self.workdir = workdir
        self.script = dict(script)
        self.env = dict(env or {})
        self.names = [f"r{i}" for i in range(n)]
        self.ports = [free_port() for _ in range(n)]
        self.processes: list[ServerProcess | None] = [None] * n
        self.health_path = health_path
        self._start = list(range(n)) if start is None else list(start)
        self._restarts = [0] * n
        self.database_url: str | None = None
        self.balancer: Balancer | None = None

    # -- lifecycle --------------------------------------------------------------------------

    def __enter__(self) -> Cluster:
        try:
            self.database_url = asyncio.run(create_database("ledger_replicas"))
            for index in self._start:
                self.start_replica(index, wait=False)
            self.balancer = Balancer(
                self.workdir,
                list(zip(self.names, self.ports, strict=True)),
                health_path=self.health_path,
            )
            for index in self._start:
                self.wait_ready(index)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self.balancer is not None:
            self.balancer.stop()
        for process in self.processes:
            if process is not None and process.alive:
                process.signal(signal.SIGCONT)  # a frozen one must be able to die
                process.kill()
        if self.database_url is not None:
            asyncio.run(drop_database(self.database_url))
            self.database_url = None

    @property
    def url(self) -> str:
        assert self.balancer is not None, "the cluster is not started"
        return self.balancer.url

    def process(self, index: int) -> ServerProcess:
        process = self.processes[index]
        assert process is not None, f"replica {self.names[index]} is not running"
        return process

    def start_replica(self, index: int, *, wait: bool = True) -> ServerProcess:
        """Start replica ``index`` on its port (again, after a restart); with ``wait``, until its
        ``/health/ready`` answers 200 and HAProxy has it UP."""
        assert self.database_url is not None
        run = self._restarts[index]
        self._restarts[index] += 1
        name = self.names[index] if run == 0 else f"{self.names[index]}-{run}"
        process = ServerProcess(
            self.workdir,
            name,
            self.database_url,
            self.script,
            model=MODEL,
            env=self.env,
            port=self.ports[index],
        )
        self.processes[index] = process
        if wait:
            self.wait_ready(index)
        return process

    def wait_ready(self, index: int, timeout_s: float = 60) -> None:
        process = self.process(index)
        deadline = time.monotonic() + timeout_s
        status: int | None = None
        while status != 200:
            if not process.alive:
                raise AssertionError(
                    f"replica {process.name} exited ({process.returncode}):\n{process.log_text()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"replica {process.name}: {self.health_path} answered {status}, not 200, for {timeout_s} s"
                )
            try:
                status = httpx.get(process.base_url + self.health_path, timeout=2).status_code
            except httpx.TransportError:
                status = None
            if status == 404:  # never becomes 200: say so now rather than after the timeout
                raise AssertionError(
                    f"replica {process.name}: GET {self.health_path} answered 404 "
                    "(the server has no readiness endpoint)"
                )
            if status != 200:
                time.sleep(0.05)
        assert self.balancer is not None
        self.balancer.wait_servers({self.names[index]: "UP"}, timeout_s=timeout_s)

    def stop_replica(self, index: int, timeout_s: float = 60) -> int:
        """SIGTERM replica ``index`` and wait for it to exit; its exit status."""
        process = self.process(index)
        process.signal(signal.SIGTERM)
        try:
            process.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            raise AssertionError(
                f"replica {process.name} did not exit within {timeout_s} s of SIGTERM"
            ) from None
        return int(process.proc.returncode)

    # -- SQL ----------------------------------------------------------------------------------

    def sql(self, query: str, *args: Any) -> list[dict[str, Any]]:
        """Rows of one query on the cluster's database (a connection of its own)."""
        assert self.database_url is not None

        async def run() -> list[dict[str, Any]]:
            connection = await asyncpg.connect(_dsn(self.database_url or ""))
            try:
                return [dict(row) for row in await connection.fetch(query, *args)]
            finally:
                await connection.close()

        return asyncio.run(run())

    def replica_ids(self) -> dict[str, int]:
        """Replica id (``replicas.id``) -> index in this cluster, by process id; only replicas
        with a row (a clean exit removes it)."""
        pids = {p.proc.pid: i for i, p in enumerate(self.processes) if p is not None}
        return {
            row["id"]: pids[row["pid"]]
            for row in self.sql("SELECT id, pid FROM replicas")
            if row["pid"] in pids
        }

    def id_of(self, index: int) -> str:
        for replica_id, i in self.replica_ids().items():
            if i == index:
                return replica_id
        raise AssertionError(
            f"no replicas row for {self.names[index]} (pid {self.process(index).proc.pid})"
        )

    def owners(self, response_ids: Sequence[str]) -> dict[str, str | None]:
        rows = self.sql(
            "SELECT id, owner FROM responses WHERE id = ANY($1::text[])", list(response_ids)
        )
        return {row["id"]: row["owner"] for row in rows}

    def takeovers(self, response_id: str) -> list[dict[str, Any]]:
        """The response's ``takeover`` audit records (detail plus ``recorded_at``), from SQL."""
        rows = self.sql(
            "SELECT detail, recorded_at FROM response_audit WHERE response_id = $1 AND kind = 'takeover' ORDER BY id",
            response_id,
        )
        out = []
        for row in rows:
            detail = row["detail"]
            detail = json.loads(detail) if isinstance(detail, str) else dict(detail or {})
            out.append({**detail, "recorded_at": row["recorded_at"]})
        return out


# -- clients ------------------------------------------------------------------------------------


def _lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        yield from complete


@dataclass
class Cut:
    """Why one leg of a stream ended before its terminal event."""

    after_seq: int
    reason: str  # "transport RemoteProtocolError", "eof", "error server_shutting_down", "http 503"


class ClientStream(threading.Thread):
    """A streamed response read to its end across cuts (see the module docstring).

    ``events``/``times``: every data frame received, in order, and ``time.monotonic()`` at its
    arrival. ``cuts``: each leg that ended early. ``errors``: the ``error`` frames. ``failure``:
    why it gave up (the POST was refused, the stream was cut before ``response.created`` named
    the response, or no resume succeeded within ``resume_within_s``); None if it ended with a
    terminal event."""

    def __init__(
        self,
        url: str,
        body: Mapping[str, Any] | None = None,
        *,
        follow: tuple[str, int] | None = None,
        resume_url: str | None = None,
        resume_within_s: float = 60,
        read_timeout_s: float = 60,
    ) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.resume_url = resume_url or url
        self.body = {"model": MODEL, "input": "go", **(body or {}), "stream": True}
        self.follow = follow  # (response id, starting_after): a GET follower, not a POST
        self.resume_within_s = resume_within_s
        self.read_timeout_s = read_timeout_s
        self.events: list[dict[str, Any]] = []
        self.times: list[float] = []
        self.cuts: list[Cut] = []
        self.errors: list[dict[str, Any]] = []
        self.failure: str | None = None
        self.response_id: str | None = follow[0] if follow else None
        self.started_at = time.monotonic()
        self.ended_at: float | None = None

    @property
    def last_seq(self) -> int:
        if self.events:
            return int(self.events[-1]["sequence_number"])
        return self.follow[1] if self.follow else -1

    @property
    def terminal(self) -> dict[str, Any] | None:
        if self.events and self.events[-1].get("type") in TERMINALS:
            return self.events[-1]
        return None

    @property
    def deltas(self) -> int:
        return sum(str(e.get("type", "")).endswith(".delta") for e in self.events)

    def run(self) -> None:
        try:
            timeout = httpx.Timeout(30, read=self.read_timeout_s)
            # no pooled connections: every leg's connection is closed with it (one left in the
            # pool to a replica that was then killed was closed only by the GC)
            limits = httpx.Limits(max_keepalive_connections=0)
            with httpx.Client(timeout=timeout, limits=limits) as client:
                outcome = self._leg(client, resume=self.follow is not None)
                give_up = time.monotonic() + self.resume_within_s
                while outcome is not None and self.failure is None:
                    self.cuts.append(Cut(self.last_seq, outcome))
                    if self.response_id is None:
                        self.failure = f"cut before response.created named the response ({outcome})"
                        break
                    while True:  # a resume may meet a replica that died before HAProxy noticed
                        if time.monotonic() > give_up:
                            self.failure = (
                                f"no resume within {self.resume_within_s} s (last: {outcome})"
                            )
                            break
                        outcome = self._leg(client, resume=True)
                        if outcome is None or not outcome.startswith(
                            ("http 5", "transport Connect")
                        ):
                            break
                        time.sleep(0.1)
        except Exception as exc:  # reported, not raised in a thread
            self.failure = f"broken {type(exc).__name__}: {exc}"
        finally:
            self.ended_at = time.monotonic()

    def _leg(self, client: httpx.Client, *, resume: bool) -> str | None:
        """One request; None if it ended with the terminal event, else why it ended early."""
        if resume:
            request = client.stream(
                "GET",
                f"{self.resume_url}/v1/responses/{self.response_id}",
                params={"stream": "true", "starting_after": self.last_seq},
            )
        else:
            request = client.stream("POST", self.url + "/v1/responses", json=self.body)
        try:
            with request as answer:
                if answer.status_code != 200:
                    text = answer.read().decode(errors="replace")[:300]
                    if not resume:
                        self.failure = f"POST answered {answer.status_code}: {text}"
                    return f"http {answer.status_code}"
                for name, data in parse_sse(_lines(answer.iter_raw())):
                    payload = json.loads(data)
                    if name == "error" or payload.get("type") == "error":
                        self.errors.append(payload)
                        code = (payload.get("error") or payload).get("code")
                        return f"error {code}"
                    self.events.append(payload)
                    self.times.append(time.monotonic())
                    if self.response_id is None and isinstance(payload.get("response"), dict):
                        self.response_id = str(payload["response"]["id"])
                    if payload.get("type") in TERMINALS:
                        return None
            return "eof"
        except httpx.HTTPError as exc:
            return f"transport {type(exc).__name__}"

    def describe(self) -> str:
        last = self.events[-1].get("type") if self.events else None
        return (
            f"{self.response_id or '?'}: {len(self.events)} events (last {last}), "
            f"cuts {[(c.after_seq, c.reason) for c in self.cuts]}, failure {self.failure}"
        )


def seq_problems(events: Sequence[Mapping[str, Any]], first: int = 0) -> tuple[int, int]:
    """(duplicates, gaps) in the ``sequence_number``s a client received, in arrival order."""
    seen: set[int] = set()
    dups = gaps = 0
    expected = first
    for event in events:
        seq = int(event["sequence_number"])
        if seq in seen:
            dups += 1
            continue
        seen.add(seq)
        if seq != expected:
            gaps += 1
        expected = seq + 1
    return dups, gaps


def poll_until_terminal(
    url: str, response_id: str, timeout_s: float = 60, interval_s: float = 0.1
) -> dict[str, Any]:
    """GET the response through ``url`` until its status is terminal; the Response. A 5xx or a
    broken connection (a replica that died between HAProxy's checks) is retried."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            answer = httpx.get(f"{url}/v1/responses/{response_id}", timeout=10)
        except httpx.TransportError as exc:
            last = type(exc).__name__
        else:
            if answer.status_code == 200:
                body = dict(answer.json())
                last = body.get("status")
                if last in TERMINAL_STATUSES:
                    return body
            elif answer.status_code < 500:
                raise AssertionError(f"GET {response_id}: {answer.status_code} {answer.text[:300]}")
            else:
                last = answer.status_code
        time.sleep(interval_s)
    raise AssertionError(f"{response_id} not terminal within {timeout_s} s (last: {last})")
