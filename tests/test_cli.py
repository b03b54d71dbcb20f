"""The ``responses-ledger`` command: db, events, replay."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx

from app.encoding import load_encoding
from app.engines.echo import EchoEngine
from app.settings import Settings
from tests.support.server import free_port, serve


def _cli(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-c", "import sys; from app.cli import main; sys.exit(main())", *args],
        capture_output=True,
        timeout=120,
        check=False,
    )


def test_db_events_and_replay(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'cli.db'}"
    upgraded = _cli("db", "upgrade", "--database-url", url)
    assert upgraded.returncode == 0, upgraded.stderr
    assert _cli("db", "current", "--database-url", url).stdout.strip() == upgraded.stdout.strip()

    settings = Settings(engine="echo", database_url=url)
    with serve(settings, engine=EchoEngine(load_encoding(), ["gpt-oss-echo"])) as server:
        response = httpx.post(
            server.base_url + "/v1/responses", json={"model": "gpt-oss-echo", "input": "hi cli"}
        ).json()
        streamed = httpx.get(
            f"{server.base_url}/v1/responses/{response['id']}", params={"stream": "true"}
        ).content

    events = _cli("events", response["id"], "--database-url", url)
    assert events.returncode == 0, events.stderr
    lines = [json.loads(line) for line in events.stdout.splitlines()]
    logged = [line for line in lines if "seq" in line]
    assert [line["seq"] for line in logged] == list(range(len(logged)))
    assert logged[-1]["type"] == "response.completed"
    assert {line["audit"] for line in lines if "audit" in line} == {
        "prompt_token_ids",
        "output_token_ids",
        "finish",
    }

    replay = _cli("replay", response["id"], "--database-url", url)
    assert replay.returncode == 0 and replay.stdout == streamed  # byte for byte

    missing = _cli("events", "resp_missing", "--database-url", url)
    assert missing.returncode == 1 and b"no response" in missing.stderr


def test_a_database_the_commands_cannot_open_is_said_in_one_line(tmp_path: Path) -> None:
    # as ``serve`` says it (tests/e2e/test_startup.py); they printed the driver's traceback
    port = free_port()  # nothing listens there
    url = f"postgresql+asyncpg://postgres:sekret@127.0.0.1:{port}/test"
    for args in (("db", "upgrade"), ("keys", "list"), ("events", "resp_x"), ("replay", "resp_x")):
        refused = _cli(*args, "--database-url", url)
        assert refused.returncode == 3, (args, refused.stderr)
        assert refused.stdout == b"" and b"Traceback" not in refused.stderr
        assert refused.stderr.decode().strip() == (
            "responses-ledger: error: cannot open the database "
            f"postgresql+asyncpg://postgres:***@127.0.0.1:{port}/test: "
            f"ConnectionRefusedError: [Errno 111] Connect call failed ('127.0.0.1', {port})"
        ), args
    unsupported = _cli("db", "current", "--database-url", "mysql://app@db/ledger")
    assert unsupported.returncode == 2
    assert unsupported.stderr.decode().strip() == (
        "responses-ledger: error: DATABASE_URL (--database-url) mysql://app@db/ledger: "
        "unsupported database 'mysql': use SQLite or PostgreSQL"
    )
