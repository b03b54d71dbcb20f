"""Replicas and leases (issue 15, in part), with real server processes: a server that starts
beside a streaming one fails none of its responses; a killed replica's responses are closed by a
survivor's sweep; a second server on one SQLite file is refused with a message that says why."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import asyncpg
import httpx
import pytest

from app.leases import SingleProcessOnly, alive, check_single_process, new_replica
from persistence.records import Replica
from tests.e2e.conftest import harmony, sse_events
from tests.support.process import ServerDidNotStart, ServerProcess

MODEL = "gpt-oss-process"
SLOW = {
    "completion": harmony(("final", " ".join(f"w{i}" for i in range(150)))),
    "token_delay_ms": 15,
}
FAST_LEASES = {
    "RESPONSES_LEDGER_LEASE_S": "1",
    "RESPONSES_LEDGER_HEARTBEAT_S": "0.25",
    "RESPONSES_LEDGER_REPAIR_INTERVAL_S": "0.1",
}


def _row(me: Replica, **change: object) -> Replica:
    fields = {
        "id": "rep_other",
        "host": me.host,
        "pid": me.pid,
        "started_at": 0.0,
        "heartbeat_at": 0.0,
        "expires_at": time.time() + 10,
    }
    fields.update(change)
    return Replica(**fields)  # type: ignore[arg-type]


def test_who_is_alive() -> None:
    me = new_replica()
    now = time.time()
    assert alive(me, me, now)
    assert alive(_row(me), me, now)  # unexpired
    assert not alive(_row(me, expires_at=now - 1), me, now)  # expired
    assert alive(_row(me, host="elsewhere", pid=1), me, now)  # another host: its lease decides
    child = os.fork()
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)
    assert not alive(_row(me, pid=child), me, now)  # gone from this host: dead at once


def test_sqlite_serves_one_process_only() -> None:
    me = new_replica()
    now = time.time()
    check_single_process([me, _row(me)], me, now)  # another server in this same process
    check_single_process([_row(me, pid=1, expires_at=now - 1)], me, now)  # expired
    with pytest.raises(SingleProcessOnly, match="SQLite serves one server process"):
        check_single_process([_row(me, host="elsewhere")], me, now)


def test_a_second_server_on_one_sqlite_file_is_refused(
    tmp_path: Path, processes: list[ServerProcess]
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'one.db'}"
    processes.append(ServerProcess(tmp_path, "first", url, {"turns": []}))
    with pytest.raises(ServerDidNotStart) as refused:
        processes.append(ServerProcess(tmp_path, "second", url, {"turns": []}, start_timeout_s=30))
    assert "SQLite serves one server process" in str(refused.value)
    assert refused.value.returncode not in (None, 0)
    assert httpx.get(processes[0].base_url + "/health", timeout=5).status_code == 200


def _background(base_url: str) -> str:
    answer = httpx.post(
        base_url + "/v1/responses",
        json={"model": MODEL, "input": "go", "background": True},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    return str(answer.json()["id"])


def _status(base_url: str, response_id: str) -> dict[str, object]:
    return dict(httpx.get(f"{base_url}/v1/responses/{response_id}", timeout=10).json())


@pytest.mark.postgres
def test_a_server_starting_beside_a_streaming_one_fails_none_of_its_responses(
    tmp_path: Path, pg_url: str, processes: list[ServerProcess]
) -> None:
    a = ServerProcess(tmp_path, "a", pg_url, {"turns": [SLOW] * 6}, env=FAST_LEASES)
    processes.append(a)
    ids = [_background(a.base_url) for _ in range(6)]
    b = ServerProcess(tmp_path, "b", pg_url, {"turns": []}, env=FAST_LEASES)  # recovers at start
    processes.append(b)
    deadline = time.monotonic() + 60
    while not all(_status(b.base_url, rid)["status"] in ("completed", "failed") for rid in ids):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert [_status(b.base_url, rid)["status"] for rid in ids] == ["completed"] * 6


def _rings_heard(pg_url: str, base_url: str) -> int:
    """How many notifications another session hears on the channel of a response that the
    server at ``base_url`` generates, from just after it starts to its end."""

    async def listen() -> int:
        heard = 0

        def count(*_: object) -> None:
            nonlocal heard
            heard += 1

        raw = await asyncpg.connect(pg_url.replace("postgresql+asyncpg", "postgresql"))
        try:
            rid = await asyncio.to_thread(_background, base_url)
            await raw.add_listener(rid, count)
            while (await asyncio.to_thread(_status, base_url, rid))["status"] != "completed":
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)  # the last commit's ring, if any, has arrived
        finally:
            await raw.close()
        return heard

    return asyncio.run(listen())


@pytest.mark.postgres
def test_a_lone_replica_rings_no_other_process_until_another_starts(
    tmp_path: Path, pg_url: str, processes: list[ServerProcess]
) -> None:
    """Alone, nobody could hear a commit's rings, so none are sent; the moment a second replica
    starts (it rings ``REPLICAS``, the first sweeps), its followers need them, and they are."""
    a = ServerProcess(tmp_path, "a", pg_url, {"turns": [SLOW] * 2}, env=FAST_LEASES)
    processes.append(a)
    assert _rings_heard(pg_url, a.base_url) == 0
    b = ServerProcess(tmp_path, "b", pg_url, {"turns": []}, env=FAST_LEASES)
    processes.append(b)
    assert _rings_heard(pg_url, a.base_url) > 20  # a commit every 15 ms token or so, each rung


@pytest.mark.postgres
@pytest.mark.parametrize("takeover", ["continue", "fail"])
def test_a_killed_replicas_response_is_taken_over_by_a_survivor(
    tmp_path: Path, pg_url: str, processes: list[ServerProcess], takeover: str
) -> None:
    env = {**FAST_LEASES, "RESPONSES_LEDGER_TAKEOVER": takeover}
    a = ServerProcess(tmp_path, "a", pg_url, {"turns": [SLOW]}, env=env)
    b = ServerProcess(tmp_path, "b", pg_url, {"turns": [SLOW]}, env=env)
    processes.extend([a, b])
    rid = _background(a.base_url)
    while _status(a.base_url, rid)["status"] != "in_progress":
        time.sleep(0.05)
    time.sleep(0.3)
    a.kill()
    killed = time.monotonic()
    # a follower on the survivor, from the start, receives the whole log once, to its end
    resumed = httpx.get(f"{b.base_url}/v1/responses/{rid}", params={"stream": "true"}, timeout=60)
    assert time.monotonic() - killed < 30
    events = sse_events(resumed.content)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = _status(b.base_url, rid)
    if takeover == "continue":
        assert events[-1]["type"] == "response.completed"
        assert final["status"] == "completed"
        words = " ".join(f"w{i}" for i in range(150))
        assert final["output"][-1]["content"][0]["text"] == words  # type: ignore[index]
        audit = httpx.get(f"{b.base_url}/v1/responses/{rid}/events", timeout=10).json()["audit"]
        (record,) = [x["detail"] for x in audit if x["kind"] == "takeover"]
        assert record["reason"] == "the server generating it stopped"
        assert record["from_replica"] != record["to_replica"]
    else:
        assert events[-1]["type"] == "response.failed"
        assert final["error"] == {
            "code": "server_error",
            "message": "the server generating it stopped",
        }


@pytest.mark.postgres
def test_a_response_the_survivor_cannot_continue_ends_takeover_failed(
    tmp_path: Path, pg_url: str, processes: list[ServerProcess]
) -> None:
    a = ServerProcess(tmp_path, "a", pg_url, {"turns": [SLOW]}, env=FAST_LEASES)
    b = ServerProcess(
        tmp_path, "b", pg_url, {"turns": [SLOW]}, env=FAST_LEASES, model="another-model"
    )
    processes.extend([a, b])
    rid = _background(a.base_url)
    while _status(a.base_url, rid)["status"] != "in_progress":
        time.sleep(0.05)
    a.kill()
    deadline = time.monotonic() + 20
    while (final := _status(b.base_url, rid))["status"] == "in_progress":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert final["status"] == "failed"
    error = final["error"]
    assert isinstance(error, dict) and error["code"] == "takeover_failed"
    assert "does not serve its model 'gpt-oss-process'" in error["message"]
