"""Drive the pinned Codex CLI (``@openai/codex`` from the root package.json) against a base URL.

``codex exec --json`` runs one non-interactive turn and prints its events as JSONL on stdout
(``thread.started``, ``turn.started``, ``item.started`` / ``item.completed``, ``turn.completed`` or
``turn.failed``). :func:`run_codex` gives it a throw-away ``CODEX_HOME`` whose ``config.toml``
defines one model provider, ``wire_api = "responses"`` at ``base_url``, with the API key read
from an environment variable holding a dummy value, so no login is needed, and retries are off
so a failing server fails the run at once. ``--strict-config`` makes Codex reject any key in that
file it does not know, so a Codex upgrade that renames one fails loudly here.

``HOME`` also points into the temporary directory: Codex runs commands in a login shell, which
would otherwise source the developer's profile into every command's output.

Install the CLI with ``scripts/install-codex.sh`` (``npm ci``); :func:`codex_binary` is None
until then and the tests that need it skip.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "API_KEY_ENV",
    "CodexRun",
    "codex_binary",
    "codex_version",
    "config_toml",
    "run_codex",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
API_KEY_ENV = "LEDGER_API_KEY"
_PROVIDER = "ledger"


def codex_binary() -> Path | None:
    """``node_modules/.bin/codex`` when ``npm ci`` installed it (and node is on PATH)."""
    binary = REPO_ROOT / "node_modules" / ".bin" / "codex"
    return binary if binary.exists() and shutil.which("node") else None


def codex_version() -> str:
    binary = codex_binary()
    assert binary is not None, "Codex CLI not installed: run scripts/install-codex.sh"
    out = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, timeout=60, check=True
    )
    return out.stdout.strip()  # "codex-cli 0.171.0"


def config_toml(
    *,
    base_url: str,
    model: str,
    stream_idle_timeout_ms: int = 30_000,
    provider: str = "custom",
    extra: Sequence[str] = (),
) -> str:
    """A ``config.toml`` selecting one Responses API provider at ``base_url`` (ending in /v1).

    ``provider="openai"``: Codex's built-in OpenAI provider pointed at ``base_url`` with
    ``openai_base_url`` instead (it speaks WebSocket mode first, with its own retries; the key
    comes from ``CODEX_API_KEY``). ``extra``: more top-level lines (``key = value``)."""
    if provider == "openai":
        return "\n".join(
            [
                f"model = {_toml_str(model)}",
                f"openai_base_url = {_toml_str(base_url)}",
                *extra,
                "check_for_update_on_startup = false",
                'web_search = "disabled"',
                "",
                "[analytics]",
                "enabled = false",
                "",
            ]
        )
    return "\n".join(
        [
            f"model = {_toml_str(model)}",
            f"model_provider = {_toml_str(_PROVIDER)}",
            *extra,
            "check_for_update_on_startup = false",
            # Codex offers its hosted web_search tool by default; this server runs no hosted
            # tools and refuses a request that declares one (app.contract)
            'web_search = "disabled"',
            "",
            "[analytics]",
            "enabled = false",
            "",
            f"[model_providers.{_PROVIDER}]",
            'name = "responses-ledger"',
            f"base_url = {_toml_str(base_url)}",
            f"env_key = {_toml_str(API_KEY_ENV)}",
            'wire_api = "responses"',
            "request_max_retries = 0",
            "stream_max_retries = 0",
            f"stream_idle_timeout_ms = {int(stream_idle_timeout_ms)}",
            "",
        ]
    )


@dataclass(frozen=True)
class CodexRun:
    returncode: int
    events: list[dict[str, Any]]  # the JSONL events printed on stdout
    stderr: str

    def of_type(self, event_type: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("type") == event_type]

    def items(self, item_type: str) -> list[dict[str, Any]]:
        """The ``item`` of every ``item.completed`` event whose item has ``item_type``."""
        return [
            e["item"] for e in self.of_type("item.completed") if e["item"].get("type") == item_type
        ]

    def describe(self) -> str:
        lines = [f"codex exited {self.returncode}"]
        lines += [json.dumps(e)[:400] for e in self.events]
        lines += ["stderr:", self.stderr[-3000:]]
        return "\n".join(lines)


def run_codex(
    prompt: str,
    *,
    base_url: str,
    model: str = "gpt-oss-120b",
    workdir: Path,
    sandbox: str = "read-only",
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
    provider: str = "custom",
    api_key: str = "sk-ledger-dummy",
    config: Sequence[str] = (),
) -> CodexRun:
    """Run ``codex exec --json ... "<prompt>" </dev/null`` in ``workdir``; return its events.

    Raises AssertionError if stdout holds anything but JSON lines; the exit status is returned,
    not checked (a test about failures wants it).
    """
    binary = codex_binary()
    assert binary is not None, "Codex CLI not installed: run scripts/install-codex.sh"
    with tempfile.TemporaryDirectory(prefix="codex-home-") as tmp:
        home = Path(tmp)
        codex_home = home / ".codex"
        codex_home.mkdir()
        (codex_home / "config.toml").write_text(
            config_toml(base_url=base_url, model=model, provider=provider, extra=config)
        )
        process_env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "CODEX_HOME": str(codex_home),
            (API_KEY_ENV if provider == "custom" else "CODEX_API_KEY"): api_key,
            "LANG": "C.UTF-8",
            "NO_COLOR": "1",
            **(env or {}),
        }
        command = [
            str(binary), "exec", "--json", "--strict-config", "--skip-git-repo-check", "--ephemeral",
            "--sandbox", sandbox, *extra_args, prompt,
        ]  # fmt: skip
        done = subprocess.run(
            command,
            cwd=workdir,
            env=process_env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    events = []
    for number, line in enumerate(done.stdout.splitlines(), 1):
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except ValueError:
            raise AssertionError(
                f"codex stdout line {number} is not JSON: {line!r}\n{done.stderr}"
            ) from None
    return CodexRun(returncode=done.returncode, events=events, stderr=done.stderr)


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string
