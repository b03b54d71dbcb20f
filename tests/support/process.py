"""A real ``responses-ledger serve`` process (scripted engine), for tests that kill or starve it.

In-thread servers (``tests/support/server.py``) share the test's interpreter, so they cannot be
killed with a signal or watched starting up on a broken database. This one is a child process
with its own log file:

    server = ServerProcess(tmp_path, "first", "sqlite+aiosqlite:///...", {"turns": [...]},
                           env={"RESPONSES_LEDGER_STORE_RETRY_S": "1"})
    server.base_url                  # http://127.0.0.1:<port>
    server.kill()                    # SIGKILL (or server.signal(signal.SIGTERM))
    server.stop()                    # SIGTERM, then SIGKILL after a grace period

``args=`` adds ``serve`` options (``["--frontends", "2"]``); ``engine_args=`` replaces the
scripted engine's (``["--engine", "vllm", "--model", ...]``). ``port=`` gives the port (default: a free one), so a restarted server comes back where a load
balancer expects it (``tests/support/replicas.py``). ``ready="healthy"`` (the default) waits for ``/health`` to answer 200; ``ready="listening"``
waits for any HTTP answer from ``/health``, for a server that is expected to start degraded
(503) on a store it cannot write. The child inherits the test's environment (so ``PYTHONPATH``
picks the worktree's code) minus the variables that would change what it serves.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from tests.support.server import free_port

__all__ = ["ServerDidNotStart", "ServerProcess", "command", "without_modules"]

REPO = Path(__file__).resolve().parents[2]

#: Variables of the test's own environment that would change what the child serves.
_SCRUBBED = (
    "DATABASE_URL",
    "RESPONSES_LEDGER_RECOVER_ON_START",
    "RESPONSES_LEDGER_MODEL_ALIASES",
    "RESPONSES_LEDGER_ENGINE",
    "RESPONSES_LEDGER_SCRIPT",
    "RESPONSES_LEDGER_PORT",
    "RESPONSES_LEDGER_HOST",
    "RESPONSES_LEDGER_SERVED_MODEL_NAME",
    "RESPONSES_LEDGER_STORE_RETRY_S",
    "RESPONSES_LEDGER_STATEMENT_TIMEOUT_S",
    "RESPONSES_LEDGER_REPAIR_INTERVAL_S",
    "RESPONSES_LEDGER_LEASE_S",
    "RESPONSES_LEDGER_HEARTBEAT_S",
    "RESPONSES_LEDGER_TAKEOVER",
    "RESPONSES_LEDGER_DRAIN_S",
)


def without_modules(workdir: Path, *names: str) -> dict[str, str]:
    """``PYTHONPATH`` for a child process in which each of ``names`` (top-level modules) fails to
    import, as on an install that lacks them: a directory of modules that raise ``ImportError``,
    first on the path, made in ``workdir``."""
    blocker = workdir / "without_modules"
    blocker.mkdir(exist_ok=True)
    for name in names:
        (blocker / f"{name}.py").write_text(f"raise ImportError('{name} is not installed here')\n")
    path = os.pathsep.join(p for p in (str(blocker), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path}


class ServerDidNotStart(AssertionError):
    """The process exited (``returncode``) or never became ready (``returncode`` None)."""

    def __init__(self, message: str, returncode: int | None) -> None:
        super().__init__(message)
        self.returncode = returncode


def command() -> str:
    """The ``responses-ledger`` console script of this interpreter's environment."""
    local = Path(sys.executable).parent / "responses-ledger"
    found = str(local) if local.exists() else shutil.which("responses-ledger")
    assert found, "the responses-ledger command is not installed"
    return found


class ServerProcess:
    def __init__(
        self,
        workdir: Path,
        name: str,
        database_url: str,
        script: Mapping[str, Any],
        *,
        model: str = "gpt-oss-process",
        env: Mapping[str, str] | None = None,
        ready: str = "healthy",
        start_timeout_s: float = 60,
        log_level: str = "warning",
        port: int | None = None,
        args: Sequence[str] = (),
        engine_args: Sequence[str] | None = None,
    ) -> None:
        if ready not in ("healthy", "listening"):
            raise ValueError(f"ready must be 'healthy' or 'listening', not {ready!r}")
        self.name = name
        self.model = model
        self.database_url = database_url
        self.script_path = workdir / f"{name}.json"
        self.script_path.write_text(json.dumps(dict(script)))
        # A given port: a replica restarted where a load balancer expects it.
        self.port = free_port() if port is None else port
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / f"{name}.log"
        child_env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
        child_env["RESPONSES_LEDGER_CACHE"] = str(REPO / ".cache")
        child_env.update(env or {})
        self.env = child_env
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    command(),
                    "serve",
                    *(
                        ("--engine", "scripted", "--script", str(self.script_path))
                        if engine_args is None
                        else engine_args
                    ),
                    "--database-url",
                    database_url,
                    "--port",
                    str(self.port),
                    "--served-model-name",
                    model,
                    "--log-level",
                    log_level,
                    *args,
                ],
                cwd=REPO,
                env=child_env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            self.wait_ready(ready, start_timeout_s)
        except BaseException:
            self.stop()
            raise

    def wait_ready(self, ready: str = "healthy", timeout_s: float = 60) -> int:
        """Wait until ``/health`` answers (200 for ``healthy``, anything for ``listening``);
        returns its status code. Fails at once if the process exits."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise ServerDidNotStart(
                    f"the server {self.name!r} exited ({self.proc.returncode}):\n{self.log_text()}",
                    self.proc.returncode,
                )
            try:
                status = httpx.get(self.base_url + "/health", timeout=2).status_code
            except httpx.TransportError:
                status = None
            if status is not None and (ready == "listening" or status == 200):
                return status
            if time.monotonic() > deadline:
                raise ServerDidNotStart(
                    f"the server {self.name!r} did not become {ready} within {timeout_s} s "
                    f"(last /health: {status}):\n{self.log_text()}",
                    None,
                )
            time.sleep(0.05)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL, and reap it."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self, grace_s: float = 20) -> None:
        """SIGTERM (a graceful shutdown), SIGKILL if it is still there after ``grace_s``."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""
