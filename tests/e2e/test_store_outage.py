"""A database outage while responses stream (issue 14), in-process: a real server, a real
SQLite file, and another connection holding the database's write lock, as a second process or
an operator's ``sqlite3`` session would.

The stream ends with an ``error`` event (never a silent EOF), ``/health`` and new writes say
503 while the database is away, and once it is back the running server closes the response
``failed`` / ``store_unavailable``: GET shows it, a resumer receives the terminal event, and
every event the client was sent is in the log as sent. (Faults of a whole database server,
full disks and read-only files, with server processes, are in ``tests/faults``.)
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.encoding import load_encoding
from app.engines.scripted import ScriptedEngine
from app.settings import Settings
from tests.e2e.conftest import harmony, sse_events
from tests.support.metrics import samples
from tests.support.server import RunningServer, serve
from tests.support.sqlite_lock import SqliteLock

MODEL = "gpt-oss-outage"
TEXT = " ".join(f"w{i}" for i in range(400))  # ~800 tokens at 5 ms: ~4 s of streaming


@pytest.fixture
def outage_server(tmp_path: Path) -> Iterator[tuple[RunningServer, Path, ScriptedEngine]]:
    db = tmp_path / "outage.db"
    engine = ScriptedEngine(load_encoding(), [MODEL], {"turns": []})
    settings = Settings(
        engine="scripted",
        database_url=f"sqlite+aiosqlite:///{db}",
        served_model_names=(MODEL,),
        store_retry_s=0.8,
        statement_timeout_s=0.2,
        repair_interval_s=0.1,
    )
    with serve(settings, engine=engine) as server:
        yield server, db, engine


def _frames(chunk: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for frame in chunk.split("\n\n"):
        kind = data = None
        for line in frame.split("\n"):
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
        if kind and data is not None:
            out.append((kind, data))
    return out


async def test_an_outage_ends_the_stream_with_an_error_and_the_log_is_closed_after(
    outage_server: tuple[RunningServer, Path, ScriptedEngine],
) -> None:
    server, db, engine = outage_server
    engine.add_turns({"completion": harmony(("final", TEXT)), "token_delay_ms": 5})
    body = {"model": MODEL, "input": "talk", "stream": True}
    received: list[tuple[str, dict[str, Any]]] = []
    lock: SqliteLock | None = None
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        async with client.stream("POST", "/v1/responses", json=body) as stream:
            assert stream.status_code == 200
            buffer = ""
            async for text in stream.aiter_text():
                buffer += text
                complete, _, buffer = buffer.rpartition("\n\n")
                received.extend(_frames(complete))
                if lock is None and len(received) >= 20:
                    lock = SqliteLock(db)
                    locked_at = time.monotonic()
            received.extend(_frames(buffer))
        assert lock is not None, "the response ended before the lock was taken"
        try:
            kind, error = received[-1]
            assert kind == "error", received[-3:]
            assert error["type"] == "error" and error["code"] == "store_unavailable"
            assert error["sequence_number"] == received[-2][1]["sequence_number"] + 1
            assert time.monotonic() - locked_at < 10
            response_id = received[0][1]["response"]["id"]

            health = await client.get("/health")
            assert health.status_code == 503 and "database" in health.json()["reason"]
            refused = await client.post("/v1/responses", json={"model": MODEL, "input": "hi"})
            assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
            assert refused.json()["error"]["code"] == "store_unavailable"
            # a store=false response needs no database
            ephemeral = await client.post(
                "/v1/responses", json={"model": MODEL, "input": "hi", "store": False}
            )
            assert ephemeral.status_code == 200, ephemeral.text
        finally:
            lock.release()

        async with asyncio.timeout(15):
            while (await client.get(f"/v1/responses/{response_id}")).json()["status"] != "failed":
                await asyncio.sleep(0.1)
        final = (await client.get(f"/v1/responses/{response_id}")).json()
        assert final["error"]["code"] == "store_unavailable"
        assert (await client.get("/health")).status_code == 200

        # every event the client was sent is in the log, as sent
        log = (await client.get(f"/v1/responses/{response_id}/events")).json()["data"]
        by_seq = {e["seq"]: e for e in log}
        for kind, data in received[:-1]:
            stored = by_seq[data["sequence_number"]]
            payload = {k: v for k, v in data.items() if k not in ("type", "sequence_number")}
            assert (stored["type"], stored["payload"]) == (kind, payload)
        assert log[-1]["type"] == "response.failed"
        assert [e["seq"] for e in log] == list(range(len(log)))

        # a resumer from the last event it saw receives the rest, ending with the terminal event
        last = received[-2][1]["sequence_number"]
        resumed = await client.get(
            f"/v1/responses/{response_id}", params={"stream": "true", "starting_after": last}
        )
        tail = _frames(resumed.text)
        assert tail and tail[-1][0] == "response.failed"
        assert tail[0][1]["sequence_number"] == last + 1

        # and the server takes new responses again
        engine.add_turns({"completion": harmony(("final", "back"))})
        again = await client.post("/v1/responses", json={"model": MODEL, "input": "hi"})
        assert again.status_code == 200 and again.json()["status"] == "completed"

        # and the metrics tell it: failed and retried commits, the stopped run counted failed
        scraped = samples((await client.get("/metrics")).text)
        assert scraped["ledger_store_errors_total"] >= 1
        assert scraped["ledger_store_retries_total"] >= 1
        assert scraped["ledger_store_writable"] == 1
        assert scraped[f'ledger_responses_total{{model="{MODEL}",status="failed"}}'] == 1


class PanicException(BaseException):
    """Stands in for pyo3's ``PanicException`` (a BaseException, not importable by name)."""


async def test_a_run_that_dies_of_a_panic_is_closed_and_its_stream_ends_with_an_error(
    outage_server: tuple[RunningServer, Path, ScriptedEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Rust panic inside the Harmony decoder escapes ``except Exception``: the run must still
    end its streams with an ``error`` event and its log with ``response.failed``."""
    from domain.decoder import HarmonyDecoder

    server, _, engine = outage_server
    engine.add_turns({"completion": harmony(("final", TEXT)), "token_delay_ms": 2})
    feed = HarmonyDecoder.feed
    fed: list[int] = []

    def panic(self: HarmonyDecoder, token_ids: Any) -> None:
        fed.append(1)
        if len(fed) > 20:
            raise PanicException("called `Option::unwrap()` on a `None` value")
        feed(self, token_ids)

    monkeypatch.setattr(HarmonyDecoder, "feed", panic)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        answer = await client.post(
            "/v1/responses", json={"model": MODEL, "input": "x", "stream": True}
        )
        frames = _frames(answer.text)
        assert frames, (answer.status_code, answer.text)
        assert frames[-1][0] == "error" and frames[-1][1]["code"] == "server_error"
        response_id = frames[0][1]["response"]["id"]
        async with asyncio.timeout(10):
            while (await client.get(f"/v1/responses/{response_id}")).json()["status"] != "failed":
                await asyncio.sleep(0.05)


def test_a_slow_resumer_catches_up_from_the_log_instead_of_piling_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader resuming a live response reads slower than it is generated: its queue is
    bounded by ``send_buffer_bytes``; past that it re-reads from the log, so it still gets
    every event once, in order, to the terminal event."""
    import socket

    from app.live import Run

    subscribed: list[int | None] = []
    subscribe = Run.subscribe

    def spy(self: Run, limit_bytes: int | None = None) -> Any:
        subscribed.append(limit_bytes)
        return subscribe(self, limit_bytes)

    monkeypatch.setattr(Run, "subscribe", spy)
    engine = ScriptedEngine(load_encoding(), [MODEL], {"turns": []})
    engine.add_turns({"completion": harmony(("final", TEXT)), "token_delay_ms": 1})
    settings = Settings(
        engine="scripted",
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'slow.db'}",
        served_model_names=(MODEL,),
        send_buffer_bytes=4096,
    )
    with serve(settings, engine=engine) as server:
        made = httpx.post(
            server.base_url + "/v1/responses",
            json={"model": MODEL, "input": "go", "background": True},
            timeout=30,
        )
        response_id = made.json()["id"]
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(30)
        sock.connect(("127.0.0.1", int(server.base_url.rsplit(":", 1)[1])))
        with sock:
            sock.sendall(
                f"GET /v1/responses/{response_id}?stream=true&starting_after=0 HTTP/1.1\r\n"
                "Host: 127.0.0.1\r\n\r\n".encode()
            )
            raw = b""
            while not raw.endswith(b"\r\n0\r\n\r\n"):  # to the end of the chunked body
                time.sleep(0.02)  # slower than the engine: ~2,000 bytes a read
                chunk = sock.recv(2048)
                assert chunk, raw[-300:]
                raw += chunk
    chunked, body = raw.partition(b"\r\n\r\n")[2], b""
    while chunked:  # undo the chunked transfer encoding (a chunk line may cut a frame anywhere)
        size_line, _, rest = chunked.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0 or len(rest) < size:
            body += rest[:size]
            break
        body += rest[:size]
        chunked = rest[size + 2 :]
    seqs = [e["sequence_number"] for e in sse_events(body) if "sequence_number" in e]
    assert seqs == list(range(1, len(seqs) + 1))
    assert (
        len([limit for limit in subscribed if limit == 4096]) >= 2
    )  # it fell behind and caught up
