"""Re-record tests/fixtures/codex and tests/fixtures/agents from the pinned clients.

    . .venv/bin/activate && scripts/install-codex.sh && python -m tests.clients.record_fixtures

Writes what the clients sent to the recording fake in ``tests.clients.captures``: the JSON body
of every ``POST /v1/responses`` (turn 1, then turn 2, which replays turn 1's output and the tool
result), the request headers of turn 1, and Codex's ``--json`` output. Codex bodies carry fresh
session ids, the date and the temporary working directory on every run; the tests compare shapes,
not those values (``test_*_fixtures_match_a_live_capture``). Run it after bumping ``@openai/codex``
or ``openai-agents``, and read the diff: it is the change the server has to follow.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.clients.captures import agents_session, codex_session
from tests.clients.fake_server import RecordingServer
from tests.support.codex import codex_version

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
_VOLATILE_HEADERS = frozenset({"host", "content-length"})


def main() -> None:
    codex_dir = FIXTURES / "codex"
    with tempfile.TemporaryDirectory(prefix="codex-work-") as work:
        session = codex_session(Path(work))
    assert session.run.returncode == 0, session.run.describe()
    _write_turns(codex_dir, "", session.server)
    _write(codex_dir / "exec.jsonl", "".join(json.dumps(e) + "\n" for e in session.run.events))
    with tempfile.TemporaryDirectory(prefix="codex-work-") as work:
        catalog = codex_session(Path(work), model="gpt-5.5")
    _write_json(
        codex_dir / "catalog-model-gpt-5.5.turn1.request.json", catalog.server.response_bodies[0]
    )
    _write(codex_dir / "VERSION", codex_version() + "\n")

    agents_dir = FIXTURES / "agents"
    for streamed, prefix in ((False, "run."), (True, "streamed.")):
        result = asyncio.run(agents_session(streamed=streamed))
        _write_turns(agents_dir, prefix, result.server)
    print(f"wrote {codex_dir} and {agents_dir}")


def _write_turns(directory: Path, prefix: str, server: RecordingServer) -> None:
    bodies = server.response_bodies
    assert len(bodies) == 2, f"expected 2 requests, got {len(bodies)}"
    for number, body in enumerate(bodies, 1):
        _write_json(directory / f"{prefix}turn{number}.request.json", body)
    first = next(r for r in server.requests if r.path == "/v1/responses")
    headers = {k: v for k, v in sorted(first.headers.items()) if k not in _VOLATILE_HEADERS}
    _write_json(directory / f"{prefix}headers.json", headers)


def _write_json(path: Path, value: Mapping[str, Any]) -> None:
    _write(path, json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
