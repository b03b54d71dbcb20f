"""Issue 15, with real server processes and no load balancer: a SIGTERM drains (readiness 503,
new responses refused, in-flight ones finish, or end ``incomplete`` when no replica can take
them), and a cancel or DELETE asked through one replica reaches the replica generating the
response. (``test_replicas.py`` drives the same through HAProxy, with three replicas.)"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import asyncpg
import httpx
import pytest

from tests.e2e.conftest import harmony, sse_events
from tests.support.process import ServerProcess

MODEL = "gpt-oss-process"
WORDS = " ".join(f"w{i}" for i in range(150))
SLOW = {"completion": harmony(("final", WORDS)), "token_delay_ms": 15}  # ~2.5 s
FAST_LEASES = {
    "RESPONSES_LEDGER_LEASE_S": "1",
    "RESPONSES_LEDGER_HEARTBEAT_S": "0.25",
    "RESPONSES_LEDGER_REPAIR_INTERVAL_S": "0.1",
}


def _background(base_url: str) -> str:
    answer = httpx.post(
        base_url + "/v1/responses",
        json={"model": MODEL, "input": "go", "background": True},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    return str(answer.json()["id"])


def _get(base_url: str, response_id: str) -> httpx.Response:
    return httpx.get(f"{base_url}/v1/responses/{response_id}", timeout=10)


def _wait_status(base_url: str, response_id: str, wanted: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while _get(base_url, response_id).json()["status"] != wanted:
        assert time.monotonic() < deadline, f"{response_id} never became {wanted}"
        time.sleep(0.05)


def test_sigterm_alone_lets_short_responses_finish_and_ends_the_rest_incomplete(
    tmp_path: Path, processes: list[ServerProcess]
) -> None:
    quick = {"completion": harmony(("final", "done soon")), "token_delay_ms": 100}  # ~0.5 s
    long = {"completion": harmony(("final", WORDS * 4)), "token_delay_ms": 15}  # ~10 s
    url = f"sqlite+aiosqlite:///{tmp_path / 'one.db'}"
    server = ServerProcess(
        tmp_path, "alone", url, {"turns": [quick, long]}, env={"RESPONSES_LEDGER_DRAIN_S": "1.5"}
    )
    processes.append(server)
    short_id, long_id = _background(server.base_url), _background(server.base_url)
    _wait_status(server.base_url, long_id, "in_progress")
    assert httpx.get(server.base_url + "/health/ready", timeout=5).status_code == 200
    server.signal(signal.SIGTERM)
    time.sleep(0.2)
    ready = httpx.get(server.base_url + "/health/ready", timeout=5)
    assert (ready.status_code, ready.json()) == (503, {"status": "draining"})
    assert httpx.get(server.base_url + "/health/live", timeout=5).status_code == 200
    refused = httpx.post(
        server.base_url + "/v1/responses", json={"model": MODEL, "input": "x"}, timeout=10
    )
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "server_draining"
    _wait_status(server.base_url, short_id, "completed")  # reads are still served
    server.proc.wait(timeout=20)
    assert server.returncode == 0
    again = ServerProcess(tmp_path, "again", url, {"turns": []})
    processes.append(again)
    ended = _get(again.base_url, long_id).json()
    assert ended["status"] == "incomplete"
    assert ended["incomplete_details"] == {"reason": "server_shutdown"}
    assert WORDS.startswith(ended["output"][-1]["content"][0]["text"][:50])


def _rows(pg_url: str, response_id: str) -> dict[str, int]:
    async def count() -> dict[str, int]:
        conn = await asyncpg.connect(pg_url.replace("+asyncpg", ""))
        try:
            return {
                table: int(
                    await conn.fetchval(
                        f"SELECT count(*) FROM {table} WHERE {col} = $1", response_id
                    )
                )
                for table, col in (
                    ("responses", "id"),
                    ("response_events", "response_id"),
                    ("response_input_items", "response_id"),
                    ("response_audit", "response_id"),
                )
            }
        finally:
            await conn.close()

    return asyncio.run(count())


@pytest.mark.postgres
def test_cancel_and_delete_through_another_replica(
    tmp_path: Path, pg_url: str, processes: list[ServerProcess]
) -> None:
    a = ServerProcess(tmp_path, "a", pg_url, {"turns": [SLOW] * 3}, env=FAST_LEASES)
    b = ServerProcess(tmp_path, "b", pg_url, {"turns": []}, env=FAST_LEASES)
    processes.extend([a, b])
    cancelled = _background(a.base_url)
    _wait_status(b.base_url, cancelled, "in_progress")
    with httpx.stream(
        "GET", f"{a.base_url}/v1/responses/{cancelled}?stream=true", timeout=30
    ) as on_a:
        started = time.monotonic()
        answer = httpx.post(f"{b.base_url}/v1/responses/{cancelled}/cancel", timeout=30)
        took = time.monotonic() - started
        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] == "cancelled"
        events = sse_events(on_a.read())
    assert took < 5  # the benchmark measures it; this only says it did not wait for the end
    assert (events[-1]["type"], events[-1]["response"]["status"]) == (
        "response.incomplete",
        "cancelled",
    )
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert _get(a.base_url, cancelled).json()["status"] == "cancelled"

    deleted = _background(a.base_url)
    _wait_status(b.base_url, deleted, "in_progress")
    answer = httpx.delete(f"{b.base_url}/v1/responses/{deleted}", timeout=30)
    assert answer.json() == {"id": deleted, "object": "response.deleted", "deleted": True}
    time.sleep(0.5)  # A would have appended dozens of events by now
    assert _rows(pg_url, deleted) == dict.fromkeys(
        ("responses", "response_events", "response_input_items", "response_audit"), 0
    )
    assert _get(a.base_url, deleted).status_code == 404
    assert _get(b.base_url, deleted).status_code == 404
    # A stopped generating it (its next commit found the row gone), and serves on
    assert f"response {deleted}: stopped here" in a.log_text()
    third = _background(a.base_url)
    _wait_status(a.base_url, third, "completed")


@pytest.mark.postgres
def test_a_draining_replica_takes_nothing_over(
    tmp_path: Path, pg_url: str, processes: list[ServerProcess]
) -> None:
    """B drains (a long response keeps it draining) when A dies: A's response waits for a
    replica that stays, C, instead of being claimed by one on its way out."""
    long = {"completion": harmony(("final", WORDS * 6)), "token_delay_ms": 15}  # ~15 s
    a = ServerProcess(tmp_path, "a", pg_url, {"turns": [long]}, env=FAST_LEASES)
    b = ServerProcess(
        tmp_path,
        "b",
        pg_url,
        {"turns": [long]},
        env={**FAST_LEASES, "RESPONSES_LEDGER_DRAIN_S": "30"},
    )
    processes.extend([a, b])
    on_a, on_b = _background(a.base_url), _background(b.base_url)
    _wait_status(a.base_url, on_a, "in_progress")
    _wait_status(b.base_url, on_b, "in_progress")
    b.signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while httpx.get(b.base_url + "/health/ready", timeout=5).status_code != 503:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    a.kill()
    time.sleep(2.5)  # A's lease (1 s) is long gone, and B sweeps every 0.25 s
    assert "taken over" not in b.log_text()
    c = ServerProcess(tmp_path, "c", pg_url, {"turns": [long]}, env=FAST_LEASES)
    processes.append(c)
    deadline = time.monotonic() + 20
    while True:
        audit = httpx.get(f"{c.base_url}/v1/responses/{on_a}/events", timeout=10).json()["audit"]
        takeovers = [x["detail"] for x in audit if x["kind"] == "takeover"]
        if takeovers:
            break
        assert time.monotonic() < deadline, "nobody took A's response over"
        time.sleep(0.1)
    (record,) = takeovers
    assert record["to_replica"] != record["from_replica"]
    assert f"response {on_a}: taken over" in c.log_text()
    assert f"response {on_a}: taken over" not in b.log_text()
