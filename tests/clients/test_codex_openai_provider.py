"""Codex 0.171 with its built-in OpenAI provider pointed at the ledger (``openai_base_url``).

That provider speaks WebSocket mode first (``app.websocket``): a prewarm ``response.create`` with
``generate: false``, then each request of the turn on the same socket with
``previous_response_id`` and only the new items, all ``store: false``. Before WebSocket mode it
retried the upgrade five times per run (``failed to connect to Responses WebSocket`` on stderr,
about 6 s) and fell back to HTTP. Here the whole turn, a tool call and its answer, must go over
the socket: no HTTP ``POST /v1/responses`` reaches the app, and nothing about retries or
fallback is printed.

A conversation long enough to compact (``model_auto_compact_token_limit`` below what the first
request takes) makes Codex compact remotely over the same socket: a ``response.create`` whose
input ends with a ``compaction_trigger`` item (remote compaction v2), whose output is one
``compaction`` item, then the turn goes on from the compacted history. That needs the server's
compaction (``app.compaction``); on a tree without it the test says so and skips.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.encoding import load_encoding
from app.engines.scripted import ScriptedEngine
from app.settings import Settings
from tests.e2e.conftest import MODEL, harmony
from tests.support.codex import codex_binary, run_codex
from tests.support.server import RunningServer, serve

pytestmark = [
    pytest.mark.codex,
    pytest.mark.skipif(codex_binary() is None, reason="Codex CLI not installed"),
]

KEY = "sk-codex-openai-provider"
#: What Codex prints when the socket fails: its retries and its fall back to HTTP.
RETRY_OR_FALLBACK = re.compile(
    r"failed to connect to Responses WebSocket|reconnect|retrying|falling back|fall ?back to http|"
    r"websocket closed|stream disconnected",
    re.IGNORECASE,
)


class _Seen:
    """What reached the app: ("http", method, path) and ("websocket", path) scopes."""

    def __init__(self) -> None:
        self.scopes: list[tuple[str, ...]] = []

    def wrap(self, app: Any) -> Any:
        async def watched(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                self.scopes.append(("http", scope["method"], scope["path"]))
            elif scope["type"] == "websocket":
                self.scopes.append(("websocket", scope["path"]))
            await app(scope, receive, send)

        return watched


@pytest.fixture(scope="module")
def seen() -> _Seen:
    return _Seen()


@pytest.fixture(scope="module")
def keyed_ledger(
    tmp_path_factory: pytest.TempPathFactory, engine: ScriptedEngine, seen: _Seen
) -> Iterator[RunningServer]:
    """The ledger with a key required, so the upgrade's authentication is exercised too."""
    db = tmp_path_factory.mktemp("codex-openai") / "responses.db"
    settings = Settings(
        engine="scripted",
        database_url=f"sqlite+aiosqlite:///{db}",
        served_model_names=(MODEL,),
        api_key=KEY,
    )
    with serve(settings, engine=engine, wrap=seen.wrap) as server:
        yield server


def test_codex_with_the_openai_provider_runs_its_turn_over_the_socket(
    keyed_ledger: RunningServer, engine: ScriptedEngine, seen: _Seen, tmp_path: Path
) -> None:
    with engine._lock:
        engine._next = len(engine._turns)
    engine.add_turns(
        {
            "completion": harmony(
                ("analysis", "Run the command."),
                ("commentary", "Running the command."),
                (
                    "commentary to=functions.exec_command <|constrain|>json",
                    '{"cmd":"echo socket-ok"}',
                ),
                end="<|call|>",
            )
        },
        {
            "completion": harmony(
                ("analysis", "It printed."), ("final", "The command printed socket-ok.")
            )
        },
    )
    n = engine.prompt_count
    run = run_codex(
        "Run `echo socket-ok` and tell me what it printed.",
        base_url=keyed_ledger.base_url + "/v1",
        model=MODEL,
        workdir=tmp_path,
        provider="openai",
        api_key=KEY,
    )
    assert run.returncode == 0, run.describe()
    kinds = [e["type"] for e in run.events]
    assert kinds[-1] == "turn.completed" and "turn.failed" not in kinds, run.describe()
    (command,) = run.items("command_execution")
    assert "socket-ok" in command["aggregated_output"], run.describe()
    assert [m["text"] for m in run.items("agent_message")][-1] == "The command printed socket-ok."
    assert engine.prompt_count == n + 2, run.describe()  # the prewarm generated nothing
    second = load_encoding().decode_utf8(engine.prompts[-1])
    assert "socket-ok" in second.split("echo socket-ok")[-1]  # the command's output came back
    # all of it over one socket: no HTTP request for a response, no retry, no fallback
    assert ("websocket", "/v1/responses") in seen.scopes
    assert [s for s in seen.scopes if s[0] == "http" and s[2].startswith("/v1/responses")] == []
    printed = run.stderr + "\n".join(str(e) for e in run.events)
    assert RETRY_OR_FALLBACK.search(printed) is None, run.describe()


def _tool_turn(command: str) -> dict[str, Any]:
    return {
        "completion": harmony(
            ("analysis", "Run the command."),
            (
                "commentary to=functions.exec_command <|constrain|>json",
                '{"cmd":"' + command + '"}',
            ),
            end="<|call|>",
        )
    }


SUMMARY = "Summary: the user asked to run echo compact-ok, and it ran."


@pytest.mark.skipif(
    importlib.util.find_spec("app.compaction") is None,
    reason="compaction (app.compaction, /v1/responses/compact) is not on this tree yet",
)
def test_codex_with_the_openai_provider_compacts_over_the_socket(
    keyed_ledger: RunningServer, engine: ScriptedEngine, seen: _Seen, tmp_path: Path
) -> None:
    with engine._lock:
        engine._next = len(engine._turns)
    engine.add_turns(
        _tool_turn("echo compact-ok"),
        # the compaction: the model writes the summary through the engine
        {"completion": harmony(("analysis", "Summarise."), ("final", SUMMARY))},
        {
            "completion": harmony(
                ("analysis", "Done."), ("final", "The command printed compact-ok.")
            )
        },
    )
    n = engine.prompt_count
    seen.scopes.clear()
    run = run_codex(
        "Run `echo compact-ok` and tell me what it printed.",
        base_url=keyed_ledger.base_url + "/v1",
        model=MODEL,
        workdir=tmp_path,
        provider="openai",
        api_key=KEY,
        # every request of the turn is past it: Codex compacts before the second one
        config=["model_auto_compact_token_limit = 7000", "model_context_window = 128000"],
    )
    assert run.returncode == 0, run.describe()
    kinds = [e["type"] for e in run.events]
    assert kinds[-1] == "turn.completed" and "turn.failed" not in kinds, run.describe()
    assert [m["text"] for m in run.items("agent_message")][-1] == "The command printed compact-ok."
    assert engine.prompt_count == n + 3, run.describe()  # call, summary, answer
    summary_prompt, answer_prompt = (
        load_encoding().decode_utf8(p) for p in list(engine.prompts)[-2:]
    )
    assert "compact-ok" in summary_prompt.split("echo compact-ok")[-1]  # the output was summarised
    assert SUMMARY in answer_prompt  # the turn went on from the compacted history
    assert [s for s in seen.scopes if s[0] == "http" and s[2].startswith("/v1/responses")] == []
    printed = run.stderr + "\n".join(str(e) for e in run.events)
    assert RETRY_OR_FALLBACK.search(printed) is None, run.describe()
