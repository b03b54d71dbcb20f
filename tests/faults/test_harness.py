"""The fault harness itself: the cluster really restarts, stops and freezes (and only itself),
the tmpfs really fills up and turns read-only, the write lock is really held, and the raw SSE
reader tells a clean EOF from a terminal or ``error`` frame. Without these, a fault test could
pass because its fault never happened."""

from __future__ import annotations

import asyncio
import errno
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.faults.outcomes import LiveStream, _lines, parse_sse, settle, wait_until
from tests.faults.storage import Tmpfs, WriteLock
from tests.support.pg_cluster import PgCluster
from tests.support.postgres import ADMIN_DSN
from tests.support.server import free_port

pytestmark = pytest.mark.slow


async def _select_one(dsn: str, timeout_s: float) -> int:
    connection = await asyncio.wait_for(asyncpg.connect(dsn, timeout=timeout_s), timeout_s)
    try:
        return int(await asyncio.wait_for(connection.fetchval("SELECT 1"), timeout_s))
    finally:
        connection.terminate()


def _reachable(dsn: str, timeout_s: float = 3) -> bool:
    try:
        return asyncio.run(_select_one(dsn, timeout_s)) == 1
    except (OSError, asyncpg.PostgresError, TimeoutError):
        return False


def test_the_cluster_restarts_stops_and_freezes(cluster: PgCluster) -> None:
    assert cluster.port != 5432 and _reachable(cluster.dsn)
    shared_before = _reachable(ADMIN_DSN)

    cluster.stop("fast")
    assert not cluster.running and not _reachable(cluster.dsn)
    cluster.start()
    assert _reachable(cluster.dsn)

    pid = cluster.postmaster_pid()
    cluster.restart("immediate", downtime_s=0.5)
    assert cluster.postmaster_pid() not in (None, pid) and _reachable(cluster.dsn)

    processes = cluster.processes()
    assert len(processes) >= 4  # postmaster, checkpointer, background writer, walwriter, ...
    with cluster.frozen_for():
        time.sleep(0.2)
        assert all(p.status() in ("stopped", "zombie") for p in cluster.processes())
        started = time.monotonic()
        assert not _reachable(cluster.dsn, timeout_s=1.5)  # hangs, then times out
        assert time.monotonic() - started >= 1.0
        assert _reachable(ADMIN_DSN) == shared_before  # the shared cluster is not ours to freeze
    assert _reachable(cluster.dsn)

    cluster.reset_database()
    assert _reachable(cluster.dsn)


def test_the_tmpfs_fills_up_and_turns_read_only(disk: Tmpfs) -> None:
    probe = disk.path / "probe"
    probe.write_bytes(b"x" * 4096)
    assert disk.fill() > 15 * 1024 * 1024 - 64 * 1024
    assert disk.free_bytes() == 0
    with pytest.raises(OSError) as full:
        (disk.path / "more").write_bytes(b"y" * 8192)
    assert full.value.errno == errno.ENOSPC
    disk.free()
    (disk.path / "more").write_bytes(b"y" * 8192)

    disk.readonly()
    with pytest.raises(OSError) as readonly:
        probe.write_bytes(b"z")
    assert readonly.value.errno == errno.EROFS
    assert probe.read_bytes() == b"x" * 4096  # still readable
    disk.writable()
    probe.write_bytes(b"z")


def test_the_write_lock_is_held_until_released(tmp_path: Path) -> None:
    db = tmp_path / "locked.db"
    setup = sqlite3.connect(db)
    setup.execute("PRAGMA journal_mode=WAL")
    setup.execute("CREATE TABLE t (x)")
    setup.commit()
    setup.close()
    other = sqlite3.connect(db, timeout=0.3, isolation_level=None)
    with WriteLock(db):
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            other.execute("INSERT INTO t VALUES (1)")
        assert other.execute("SELECT count(*) FROM t").fetchone() == (0,)  # readers go on
    other.execute("INSERT INTO t VALUES (1)")
    assert other.execute("SELECT count(*) FROM t").fetchone() == (1,)
    other.close()


def test_the_sse_reader_sees_frames_split_anywhere() -> None:
    raw = (
        b": ping\r\n\r\n"
        b'event: response.created\ndata: {"a": 1}\n\n'
        b'event: error\r\ndata: {"type": "error"}\r\n\r\n'
        b'event: response.completed\ndata: {"cut"'  # no blank line: never dispatched
    )
    expected = [("response.created", '{"a": 1}'), ("error", '{"type": "error"}')]
    for size in (1, 3, 7, len(raw)):
        chunks = [raw[i : i + size] for i in range(0, len(raw), size)]
        assert list(parse_sse(_lines(chunks))) == expected


# -- settle() against a fake server: it accepts the contract's endings and counts the rest ----


def _fake_logs(error_seq: int) -> dict[str, list[dict[str, Any]]]:
    def response(rid: str, status: str, error: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"id": rid, "object": "response", "status": status, "error": error}

    failed = {"code": "store_unavailable", "message": "the store was unavailable"}
    logs: dict[str, list[dict[str, Any]]] = {}
    for rid, status in (("ok", "completed"), ("error", "failed"), ("silent", "failed")):
        terminal = "response.completed" if status == "completed" else "response.failed"
        logs[rid] = [
            {
                "seq": 0,
                "type": "response.created",
                "payload": {"response": response(rid, "in_progress")},
            },
            {"seq": 1, "type": "response.output_text.delta", "payload": {"delta": "Hi"}},
            {
                "seq": 2,
                "type": terminal,
                "payload": {
                    "response": response(rid, status, None if status == "completed" else failed)
                },
            },
        ]
    logs["_error_seq"] = [{"seq": error_seq}]
    return logs


def _frame(event: dict[str, Any]) -> bytes:
    data = {"type": event["type"], "sequence_number": event["seq"], **event["payload"]}
    return f"event: {event['type']}\ndata: {json.dumps(data)}\n\n".encode()


def _fake_app(logs: dict[str, list[dict[str, Any]]]) -> Starlette:
    async def create(request: Request) -> Response:
        rid = (await request.json())["input"]
        log = logs[rid]
        body = _frame(log[0]) + _frame(log[1])
        if rid == "ok":
            body += _frame(log[2])
        elif rid == "error":
            error = {
                "type": "error",
                "code": "store_unavailable",
                "message": "gone",
                "param": None,
                "sequence_number": logs["_error_seq"][0]["seq"],
            }
            body += f"event: error\ndata: {json.dumps(error)}\n\n".encode()
        return Response(body, media_type="text/event-stream")  # "silent": EOF after the delta

    async def get(request: Request) -> Response:
        log = logs[request.path_params["rid"]]
        if request.query_params.get("stream") == "true":
            after = int(request.query_params["starting_after"])
            return Response(
                b"".join(_frame(e) for e in log[after + 1 :]), media_type="text/event-stream"
            )
        return JSONResponse(log[-1]["payload"]["response"])

    async def events(request: Request) -> Response:
        return JSONResponse({"data": logs[request.path_params["rid"]]})

    return Starlette(
        routes=[
            Route("/v1/responses", create, methods=["POST"]),
            Route("/v1/responses/{rid}", get, methods=["GET"]),
            Route("/v1/responses/{rid}/events", events, methods=["GET"]),
        ]
    )


@pytest.mark.parametrize("error_seq", [2, 1])
def test_settle_accepts_the_contract_and_counts_the_rest(error_seq: int) -> None:
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            _fake_app(_fake_logs(error_seq)), host="127.0.0.1", port=port, log_level="warning"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, 30, "the fake server")
        base = f"http://127.0.0.1:{port}"
        streams = [LiveStream(base, {"input": rid}) for rid in ("ok", "error", "silent")]
        for stream in streams:
            stream.start()
        figures = settle(base, streams, fault_ended_at=time.monotonic(), terminal_within_s=5)
    finally:
        server.should_exit = True
        thread.join(10)
    assert [s.ending for s in streams] == ["terminal", "error", "eof"]
    assert figures.endings == {"terminal": 1, "error": 1, "eof": 1}
    assert len(figures.silent) == 1 and figures.silent[0].startswith("silent:")
    assert not figures.lost and not figures.non_terminal and not figures.bad_logs
    assert not figures.bad_resumes  # the resumer of "error" got seq 2, the terminal event
    if error_seq == 2:  # the seq the next event would have taken
        assert not figures.bad_errors
    else:
        assert len(figures.bad_errors) == 1 and "sequence_number is 1" in figures.bad_errors[0]
