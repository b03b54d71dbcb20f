"""The servers the benchmark compares: a target is a start command plus what to send and expect.

Adding a server means adding a :class:`Target` to :func:`default_targets` (or passing your own list
to :func:`bench.harness.run_matrix`). A target says:

- ``argv``: the start command. Each element is a ``str.format`` template over the placeholders
  ``{python}`` (this interpreter), ``{port}``, ``{host}``, ``{workdir}`` (a fresh directory per
  server start), ``{database_url}`` (for ``database="sqlite"``/``"postgres"``: a fresh, empty
  database made by the harness) and whatever ``prepare`` returns. The harness prefixes
  ``taskset -c <server cpus>`` and waits for the port to accept connections.
- ``env``: extra environment. The harness adds ``BENCH_TOKEN_TIMES_DIR`` (see
  :mod:`bench.token_times`) when latency is measured.
- ``body(tokens)``: the JSON request body of one stream that should produce ``tokens`` tokens.
- ``expected_events(tokens)``: the exact number of SSE events per stream, or ``None`` to check
  only that every stream ends with ``response.completed``.
- ``token_marker``: ``None`` when every delta is one token; else the text of one token, counted
  in the deltas (a stream must then carry ``tokens`` of them).
- ``token_offset``: leading engine tokens that yield no delta (see :mod:`bench.token_times`).
- ``database``: ``"none"``, ``"sqlite"`` or ``"postgres"``: what "bytes stored per token" measures.
- ``prepare(workdir, tokens, token_delay_ms)``: writes what the server needs (a script file, its
  engine paced at ``token_delay_ms``) and returns extra
  placeholders for ``argv``.
- ``unavailable()``: ``None`` when the target can run here, else why not (it is then skipped).

The ledger targets run ``responses-ledger serve --engine scripted`` with a script whose one turn
(cycled) is a final-channel message of ``tokens`` one-token words (``LEDGER_WORD``). The ledger
puts every token that waited for a commit into one ``response.output_text.delta``, so its streams
carry a varying number of deltas, and the load generator counts the word in them: the tokens
delivered, as the naive peer's are counted in its deltas (one token each).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

__all__ = [
    "DEFAULT_SELECTION",
    "POSTGRES_ADMIN_DSN",
    "REPO_ROOT",
    "Target",
    "default_targets",
    "ledger_body",
    "ledger_script",
    "naive_body",
    "placeholders",
    "postgres_url",
    "render_argv",
    "server_env",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
POSTGRES_HOST = "127.0.0.1"
#: ``BENCH_POSTGRES_PORT`` points the PostgreSQL target at another cluster on this host (one on
#: a RAM disk, to tell the disk's flushes from the server's own work); default the shared one.
POSTGRES_PORT = int(os.environ.get("BENCH_POSTGRES_PORT", "5432"))
#: ``BENCH_POSTGRES_SOCKET`` (a directory): reach that cluster over its Unix socket there
#: (``.s.PGSQL.<port>``) instead of TCP on 127.0.0.1, as a database on the server's own machine
#: often is.
POSTGRES_SOCKET_DIR = os.environ.get("BENCH_POSTGRES_SOCKET") or None


def postgres_url(database: str, *, driver: str = "postgresql+asyncpg") -> str:
    """The URL of ``database`` on the benchmark's cluster (``driver="postgresql"``: a plain
    asyncpg DSN), over TCP or, with ``BENCH_POSTGRES_SOCKET``, the Unix socket."""
    if POSTGRES_SOCKET_DIR is not None:
        return f"{driver}://postgres@/{database}?host={POSTGRES_SOCKET_DIR}&port={POSTGRES_PORT}"
    return f"{driver}://postgres@{POSTGRES_HOST}:{POSTGRES_PORT}/{database}"


POSTGRES_ADMIN_DSN = postgres_url("postgres", driver="postgresql")
#: What the ledger is asked for; the scripted engine's model name.
LEDGER_MODEL = "gpt-oss-scripted"

Database = Literal["none", "sqlite", "postgres"]


def _always_available() -> str | None:
    return None


def _standard_events(tokens: int) -> int:
    """created, in_progress, item added, part added, deltas, text done, part done, item done,
    completed."""
    return tokens + 8


def _no_count(tokens: int) -> None:
    """A server whose deltas carry a varying number of tokens sends a varying number of events."""
    return None


def _no_files(workdir: Path, tokens: int, token_delay_ms: float = 0.0) -> dict[str, str]:
    return {}


@dataclass(frozen=True)
class Target:
    name: str
    argv: tuple[str, ...]
    body: Callable[[int], dict]
    expected_events: Callable[[int], int | None] = _standard_events
    #: Its deltas may carry several tokens: count this text's occurrences in them instead
    #: (``bench.loadgen``), and check that a stream's come to ``tokens``.
    token_marker: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    token_offset: int = 0
    database: Database = "none"
    prepare: Callable[[Path, int, float], dict[str, str]] = _no_files
    unavailable: Callable[[], str | None] = _always_available
    description: str = ""


def naive_body(tokens: int) -> dict:
    return {
        "model": "gpt-oss-20b",
        "input": "Write a long story.",
        "stream": True,
        "max_output_tokens": tokens,
    }


def ledger_body(tokens: int) -> dict:
    # Room for the Harmony header and stop tokens, which count against max_output_tokens.
    return {
        "model": LEDGER_MODEL,
        "input": "Write a long story.",
        "stream": True,
        "max_output_tokens": tokens + 64,
    }


#: The scripted engine's one token, repeated: the ledger's deltas carry every token that waited
#: for a commit, so the load generator counts this text in them, not the deltas.
LEDGER_WORD = " word"


def ledger_script(workdir: Path, tokens: int, token_delay_ms: float = 0.0) -> dict[str, str]:
    """Write the scripted engine's script: one cycled final-channel turn of ``tokens`` words,
    each token ``token_delay_ms`` after the previous one."""
    text = LEDGER_WORD * tokens  # one o200k token a word: the load generator counts them
    script = {
        "turns": [{"completion": f"<|channel|>final<|message|>{text}<|return|>"}],
        "cycle": True,
        "token_delay_ms": token_delay_ms,
    }
    path = workdir / "script.json"
    path.write_text(json.dumps(script))
    return {"script": str(path)}


def _ledger_unavailable() -> str | None:
    probe = subprocess.run(
        [sys.executable, "-c", "import app.cli"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return f"`import app.cli` fails: {last}"
    return None


def _postgres_unavailable() -> str | None:
    reason = _ledger_unavailable()
    if reason:
        return reason
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        return "asyncpg is not installed"
    if POSTGRES_SOCKET_DIR is not None:
        path = os.path.join(POSTGRES_SOCKET_DIR, f".s.PGSQL.{POSTGRES_PORT}")
        try:
            with socket.socket(socket.AF_UNIX) as unix:
                unix.settimeout(2)
                unix.connect(path)
        except OSError as exc:
            return f"no PostgreSQL socket at {path}: {exc}"
        return None
    try:
        with socket.create_connection((POSTGRES_HOST, POSTGRES_PORT), timeout=2):
            pass
    except OSError as exc:
        return f"no PostgreSQL on {POSTGRES_HOST}:{POSTGRES_PORT}: {exc}"
    return None


_NAIVE = (
    "{python}", "-m", "bench.naive", "--host", "{host}", "--port", "{port}",
    "--token-delay-ms", "{token_delay_ms}",
)  # fmt: skip
_LEDGER = (
    "{python}",
    "-c",
    "import sys; from app.cli import main; sys.exit(main())",
    "serve",
    "--engine",
    "scripted",
    "--script",
    "{script}",
    "--database-url",
    "{database_url}",
    "--host",
    "{host}",
    "--port",
    "{port}",
)
# Access logs off, as for the naive peer (uvicorn's access log costs several µs per request).
_LEDGER_ENV = {"RESPONSES_LEDGER_LOG_LEVEL": "warning"}


def default_targets() -> list[Target]:
    """Every target the benchmark knows, in table order; ``naive`` is the reference."""
    return [
        Target(
            "naive",
            _NAIVE,
            naive_body,
            description="Starlette + sse-starlette, one write per event, nothing stored",
        ),
        Target(
            "naive-c16",
            (*_NAIVE, "--coalesce", "16"),
            naive_body,
            description="the naive peer with 16 delta frames per write",
        ),
        Target(
            "naive-h11",
            (*_NAIVE, "--loop", "asyncio", "--http", "h11"),
            naive_body,
            description="the naive peer on the pure-Python stack (asyncio loop, h11)",
        ),
        Target(
            "naive-raw",
            (*_NAIVE, "--raw"),
            naive_body,
            description="the same bytes from a bare asyncio.Protocol, one write per event",
        ),
        Target(
            "ledger-sqlite",
            _LEDGER,
            ledger_body,
            expected_events=_no_count,
            token_marker=LEDGER_WORD,
            env=_LEDGER_ENV,
            token_offset=3,
            database="sqlite",
            prepare=ledger_script,
            unavailable=_ledger_unavailable,
            description="responses-ledger, scripted engine, SQLite (WAL)",
        ),
        Target(
            "ledger-postgres",
            _LEDGER,
            ledger_body,
            expected_events=_no_count,
            token_marker=LEDGER_WORD,
            env=_LEDGER_ENV,
            token_offset=3,
            database="postgres",
            prepare=ledger_script,
            unavailable=_postgres_unavailable,
            description="responses-ledger, scripted engine, PostgreSQL",
        ),
    ]


#: Targets run when ``--target`` is not given.
DEFAULT_SELECTION = ("naive", "naive-c16", "ledger-sqlite", "ledger-postgres")


def placeholders(
    host: str, port: int, workdir: Path, database_url: str | None, token_delay_ms: float = 0.0
) -> dict[str, str]:
    values = {
        "python": sys.executable,
        "host": host,
        "port": str(port),
        "workdir": str(workdir),
        "token_delay_ms": f"{token_delay_ms:g}",
    }
    if database_url is not None:
        values["database_url"] = database_url
    return values


def render_argv(target: Target, values: Mapping[str, str]) -> list[str]:
    return [part.format(**values) for part in target.argv]


def server_env(target: Target, extra: Mapping[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(target.env)
    env.update(extra)
    pythonpath = env.get("PYTHONPATH")
    env["PYTHONPATH"] = f"{REPO_ROOT}{os.pathsep}{pythonpath}" if pythonpath else str(REPO_ROOT)
    return env
