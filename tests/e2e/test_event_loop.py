"""The event loop and HTTP parser a served process runs on.

Every benchmark figure was measured on uvloop's event loop and httptools' parser, which a fresh
install had only when something else pulled them in (the test set-up's vLLM CPU build does; the
README's ``make serve`` did not): such a server ran on asyncio's loop and h11, and spent more
CPU a paced token (bench/RESULTS.md, twenty-ninth session). Now they are the package's own
dependencies, ``RESPONSES_LEDGER_EVENT_LOOP`` chooses the loop as ``..._HTTP_IMPLEMENTATION``
chooses the parser, and the server says at start what it runs on, read from the running loop
and the protocol in use (a warning when ``auto`` found either one missing).
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from app import transport
from app.settings import Settings
from tests.e2e.conftest import harmony
from tests.support.process import ServerDidNotStart, ServerProcess, without_modules

MODEL = "gpt-oss-loop"
TURN = {"completion": harmony(("final", "Served on the loop it names."))}


def _start_line(tmp_path: Path, name: str, **options: Any) -> str:
    """Start a real ``responses-ledger serve`` with ``options`` (``ServerProcess``'s), stream
    one response through the OpenAI SDK, stop it: the one line it logged about what it runs on."""
    server = ServerProcess(
        tmp_path,
        name,
        f"sqlite+aiosqlite:///{tmp_path / f'{name}.db'}",
        {"turns": [TURN]},
        model=MODEL,
        **options,
    )
    try:
        client = OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
        with client.responses.stream(model=MODEL, input="hi") as stream:
            text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
            final = stream.get_final_response()
        assert final.status == "completed"
        assert final.output_text == text == "Served on the loop it names."
        lines = [line for line in server.log_text().splitlines() if "event loop: " in line]
        assert len(lines) == 1, server.log_text()
        return lines[0]
    finally:
        server.stop()


def test_the_package_requires_uvloop_and_httptools() -> None:
    requirements = importlib.metadata.requires("responses-ledger") or []
    always = {
        re.split(r"[\s=<>!~;\[]", r, maxsplit=1)[0].lower()
        for r in requirements
        if "extra ==" not in r
    }
    assert {"uvloop", "httptools"} <= always, requirements


def test_a_served_process_runs_on_uvloop_and_httptools(tmp_path: Path) -> None:
    line = _start_line(tmp_path, "auto", log_level="info")
    assert "event loop: uvloop; HTTP parser: httptools" in line
    assert "not both installed" not in line


def test_asyncio_and_h11_when_the_settings_name_them(tmp_path: Path) -> None:
    env = {"RESPONSES_LEDGER_EVENT_LOOP": "asyncio", "RESPONSES_LEDGER_HTTP_IMPLEMENTATION": "h11"}
    line = _start_line(tmp_path, "asked", log_level="info", env=env)
    # asked for, so said as information, not warned about as a missing dependency
    assert "event loop: asyncio; HTTP parser: h11" in line
    assert "not both installed" not in line


def test_auto_without_uvloop_warns_at_start(tmp_path: Path) -> None:
    # the line is a warning: it shows at the default level too
    env = without_modules(tmp_path, "uvloop")
    line = _start_line(tmp_path, "fallback", log_level="warning", env=env)
    assert "event loop: asyncio; HTTP parser: httptools" in line
    assert "not both installed" in line


def test_uvloop_asked_for_and_missing_fails_at_start(tmp_path: Path) -> None:
    env = {**without_modules(tmp_path, "uvloop"), "RESPONSES_LEDGER_EVENT_LOOP": "uvloop"}
    with pytest.raises(ServerDidNotStart) as refused:
        _start_line(tmp_path, "asked-missing", env=env)
    assert refused.value.returncode not in (None, 0)
    assert "event loop 'uvloop': uvloop is not installed" in str(refused.value)


def test_the_event_loop_setting() -> None:
    assert Settings.from_env({"RESPONSES_LEDGER_EVENT_LOOP": " UVLoop "}).event_loop == "uvloop"
    assert Settings.from_env({}).event_loop == "auto"
    with pytest.raises(ValueError, match="RESPONSES_LEDGER_EVENT_LOOP"):
        Settings.from_env({"RESPONSES_LEDGER_EVENT_LOOP": "trio"})
    assert transport.loop_name("auto") == "uvloop"  # (installed: a dependency)
    assert transport.loop_name("uvloop") == "uvloop"
    assert transport.loop_name("asyncio") == "asyncio"
    with pytest.raises(ValueError, match="use auto, uvloop or asyncio"):
        transport.loop_name("trio")
