"""Codex with its built-in OpenAI provider (WebSocket mode) against a custom provider (HTTP SSE).

``python -m bench.codex_ws [--runs 5] [--tree PATH]``

Starts ``responses-ledger serve`` (scripted engine: a short reasoning and a one-sentence answer,
SQLite in a temporary directory) from ``--tree`` (default: this checkout; another checkout, such
as one without ``app.websocket``, gives the figures before it), then runs ``codex exec --json``
``--runs`` times with each provider, alternating:

- ``openai``: the built-in provider, ``openai_base_url`` pointed at the server; it opens a
  WebSocket at ``/v1/responses`` (and, where the server refuses it, retries and falls back to
  HTTP);
- ``custom``: a ``[model_providers]`` entry with ``wire_api = "responses"`` (HTTP SSE only).

Reported per provider, medians (min-max) over the runs, in seconds from starting Codex: the
first event that carries model output (``item.started``/``item.completed`` of a reasoning or
agent message item) and ``turn.completed``; and how many runs printed WebSocket retries.
Target (issue 18): the OpenAI provider's first event no later than the custom provider's.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
CODEX = REPO / "node_modules" / ".bin" / "codex"
MODEL = "gpt-oss-bench-codex"
KEY = "sk-bench-codex"
_OUTPUT_ITEMS = ("reasoning", "agent_message")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _server(tree: Path, workdir: Path) -> Iterator[str]:
    script = workdir / "script.json"
    completion = (
        "<|channel|>analysis<|message|>A short answer will do.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Hello from the ledger.<|return|>"
    )
    script.write_text(json.dumps({"turns": [{"completion": completion}], "cycle": True}))
    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "RESPONSES_LEDGER_CACHE": os.environ.get("RESPONSES_LEDGER_CACHE", str(REPO / ".cache")),
        "RESPONSES_LEDGER_API_KEY": KEY,
    }
    env.pop("DATABASE_URL", None)
    argv = [
        sys.executable, "-c", "from app.cli import main; main()", "serve",
        "--engine", "scripted", "--script", str(script),
        "--database-url", f"sqlite+aiosqlite:///{workdir / 'responses.db'}",
        "--port", str(port), "--served-model-name", MODEL, "--log-level", "warning",
    ]  # fmt: skip
    log = (workdir / "server.log").open("wb")
    proc = subprocess.Popen(
        argv, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                raise SystemExit(
                    f"the server exited: {(workdir / 'server.log').read_text()[-2000:]}"
                )
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the server did not become ready")
            time.sleep(0.1)
        yield base + "/v1"
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)
        log.close()


def _config(provider: str, base_url: str) -> str:
    common = [
        f'model = "{MODEL}"',
        "check_for_update_on_startup = false",
        'web_search = "disabled"',
        "[analytics]",
        "enabled = false",
    ]
    if provider == "openai":
        return "\n".join([f'openai_base_url = "{base_url}"', *common, ""])
    return "\n".join(
        [
            'model_provider = "ledger"',
            *common,
            "[model_providers.ledger]",
            'name = "responses-ledger"',
            f'base_url = "{base_url}"',
            'env_key = "LEDGER_API_KEY"',
            'wire_api = "responses"',
            "",
        ]
    )


def _run(provider: str, base_url: str) -> tuple[float | None, float | None, bool]:
    """(first output event, turn.completed) in seconds from the start, and whether Codex
    printed WebSocket retries."""
    with tempfile.TemporaryDirectory(prefix="bench-codex-") as tmp:
        home = Path(tmp)
        codex_home = home / ".codex"
        codex_home.mkdir()
        (codex_home / "config.toml").write_text(_config(provider, base_url))
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "CODEX_HOME": str(codex_home),
            "CODEX_API_KEY": KEY,
            "LEDGER_API_KEY": KEY,
            "NO_COLOR": "1",
        }
        argv = [
            str(CODEX), "exec", "--json", "--skip-git-repo-check", "--ephemeral",
            "--sandbox", "read-only", "Say hello.",
        ]  # fmt: skip
        started = time.monotonic()
        proc = subprocess.Popen(
            argv, cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        first = done = None
        assert proc.stdout is not None
        for line in proc.stdout:
            now = time.monotonic() - started
            try:
                event = json.loads(line)
            except ValueError:
                continue
            item = event.get("item") or {}
            if first is None and item.get("type") in _OUTPUT_ITEMS:
                first = now
            if event.get("type") == "turn.completed":
                done = now
        stderr = proc.stderr.read() if proc.stderr else ""
        proc.wait(timeout=120)
    return first, done, "failed to connect to Responses WebSocket" in stderr


def _summary(values: list[float | None]) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "none"
    missing = f", {len(values) - len(got)} missing" if len(got) < len(values) else ""
    return f"{statistics.median(got):.2f} s ({min(got):.2f}-{max(got):.2f}){missing}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.codex_ws", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tree", type=Path, default=REPO, help="the checkout whose server runs")
    args = parser.parse_args(argv)
    if not CODEX.exists():
        raise SystemExit("Codex CLI not installed: run scripts/install-codex.sh")
    figures: dict[str, list[tuple[float | None, float | None, bool]]] = {"openai": [], "custom": []}
    with (
        tempfile.TemporaryDirectory(prefix="bench-codex-server-") as work,
        _server(args.tree, Path(work)) as base,
    ):
        for _ in range(args.runs):
            for provider in ("openai", "custom"):
                figures[provider].append(_run(provider, base))
    print(f"Codex {subprocess.run([str(CODEX), '--version'], capture_output=True, text=True).stdout.strip()}, "
          f"server from {args.tree}, {args.runs} runs per provider")  # fmt: skip
    print("| provider | first output event | turn.completed | runs with WebSocket retries |")
    print("|---|---|---|---|")
    for provider, runs in figures.items():
        label = "OpenAI (WebSocket)" if provider == "openai" else "custom (HTTP SSE)"
        retries = sum(1 for r in runs if r[2])
        print(
            f"| {label} | {_summary([r[0] for r in runs])} | {_summary([r[1] for r in runs])} | "
            f"{retries}/{len(runs)} |"
        )


if __name__ == "__main__":
    main()
