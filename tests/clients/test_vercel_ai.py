"""The real Vercel AI SDK (``ai`` and ``@ai-sdk/openai``, pinned in package.json; installed by
scripts/install-codex.sh) against the real server (scripted engine): its default multi-turn chat
and a tool loop, which send earlier reasoning, messages and function calls back as
``item_reference`` items with no ``previous_response_id``."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from app.encoding import load_encoding
from app.engines.scripted import ScriptedEngine
from tests.e2e.conftest import MODEL, harmony
from tests.support.server import RunningServer

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("vercel_ai.mjs")

pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or not (ROOT / "node_modules" / "@ai-sdk" / "openai").is_dir(),
    reason="needs node and the pinned Vercel AI SDK (scripts/install-codex.sh)",
)


def _references(body: dict[str, Any]) -> list[str]:
    return [item["id"] for item in body.get("input", []) if item.get("type") == "item_reference"]


def test_chat_and_tool_loop(ledger: RunningServer, engine: ScriptedEngine) -> None:
    first = engine.prompt_count  # the engine is the session's: earlier tests' prompts come first
    engine.add_turns(
        {"completion": harmony(("analysis", "Greet them."), ("final", "ANSWER-ONE"))},
        {"completion": harmony(("analysis", "Go on."), ("final", "ANSWER-TWO"))},
        {"completion": harmony(("final", "ANSWER-THREE"))},
        {
            "completion": harmony(
                ("analysis", "Call the tool."),
                ("commentary to=functions.get_weather <|constrain|>json", '{"city": "Paris"}'),
                end="<|call|>",
            )
        },
        {
            "completion": harmony(
                ("analysis", "It said sunny."), ("final", "Sunny and 21 C in Paris.")
            )
        },
    )
    done = subprocess.run(
        ["node", str(SCRIPT), ledger.base_url + "/v1", MODEL],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    decode = load_encoding().decode_utf8
    # this test's prompts (the engine keeps the session's last 64)
    prompts = list(engine.prompts)[len(engine.prompts) - (engine.prompt_count - first) :]

    chat = out["chat"]
    assert [t["text"] for t in chat] == ["ANSWER-ONE", "ANSWER-TWO", "ANSWER-THREE"]
    assert all(t["finishReason"] == "stop" and t["id"].startswith("resp_") for t in chat)
    bodies = [r["body"] for r in out["requests"]]
    assert all("previous_response_id" not in b for b in bodies)
    # turn 2 referenced turn 1's reasoning and message; turn 3 both turns' items
    assert len(_references(bodies[1])) == 2 and len(_references(bodies[2])) == 4
    third_prompt = decode(prompts[2])
    for text in ("CHAT-ONE", "ANSWER-ONE", "CHAT-TWO", "ANSWER-TWO", "CHAT-THREE"):
        assert text in third_prompt

    tools = out["tools"]
    assert tools["calls"] == ["Paris"]
    assert tools["text"] == "Sunny and 21 C in Paris."
    assert [s["finishReason"] for s in tools["steps"]] == ["tool-calls", "stop"]
    second_step = bodies[4]
    assert len(_references(second_step)) >= 1  # the function call (and its reasoning) by reference
    assert any(item.get("type") == "function_call_output" for item in second_step["input"])
    step_prompt = decode(prompts[4])
    assert "to=functions.get_weather" in step_prompt and "sunny" in step_prompt
