"""Starting and stopping ``responses-ledger serve`` as an operator does, from a shell.

A setting that cannot be used is said in one line before anything starts (exit status 2); a
server that cannot start for a reason its operator can act on says that reason in one line,
without a traceback (status 3, as before); Ctrl-C stops a server (uvicorn's shutdown, without
SIGTERM's drain) and it exits 0, without the ``KeyboardInterrupt`` traceback that followed
"Finished server process". Each
test starts a real server process (``app.startup``, ``app.settings``, ``app.transport.run``).
"""

from __future__ import annotations

import signal
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import harmony
from tests.support.process import ServerDidNotStart, ServerProcess
from tests.support.server import free_port

TURN = {"completion": harmony(("final", "started"))}


def _refused(tmp_path: Path, name: str, url: str | None = None, **options: Any) -> tuple[int, str]:
    """Start a server that must not start: its exit status and everything it printed."""
    database = url or f"sqlite+aiosqlite:///{tmp_path / f'{name}.db'}"
    try:
        started = ServerProcess(tmp_path, name, database, {"turns": [TURN]}, **options)
    except ServerDidNotStart as refused:
        status = refused.returncode
        assert status is not None, str(refused)  # it exited, it did not hang
        return status, (tmp_path / f"{name}.log").read_text()
    started.stop()  # (not left running: a failed run of these tests left such servers behind)
    pytest.fail(f"the server started:\n{started.log_text()}")


def _served(tmp_path: Path, name: str, **options: Any) -> str:
    """Start a server that must start, see it answer, stop it: everything it printed."""
    database = f"sqlite+aiosqlite:///{tmp_path / f'{name}.db'}"
    server = ServerProcess(tmp_path, name, database, {"turns": [TURN]}, **options)
    try:
        assert httpx.get(server.base_url + "/health", timeout=5).status_code == 200
    finally:
        server.stop()
    return server.log_text()


def _error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if "error" in line.lower()]


def test_ctrl_c_stops_the_server_without_a_traceback(tmp_path: Path) -> None:
    server = ServerProcess(
        tmp_path,
        "ctrl-c",
        f"sqlite+aiosqlite:///{tmp_path / 'c.db'}",
        {"turns": [TURN]},
        log_level="info",
    )
    try:
        server.signal(signal.SIGINT)
        assert server.proc.wait(timeout=30) == 0
    finally:
        server.stop()
    output = server.log_text()
    assert "Finished server process" in output  # uvicorn's shutdown ran to its end
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        (
            "RESPONSES_LEDGER_HTTP_MAX_HEAD_BYTES",
            "64k",
            "RESPONSES_LEDGER_HTTP_MAX_HEAD_BYTES='64k': takes a whole number",
        ),
        # a typo used to turn the switch off, silently
        (
            "RESPONSES_LEDGER_METRICS",
            "ture",
            "RESPONSES_LEDGER_METRICS='ture': takes true or false",
        ),
        ("RESPONSES_LEDGER_DRAIN_S", "5s", "RESPONSES_LEDGER_DRAIN_S='5s': takes a number"),
        ("RESPONSES_LEDGER_EVENT_LOOP", "trio", "takes auto, uvloop or asyncio"),
        ("RESPONSES_LEDGER_TAKEOVER", "resume", "takes continue or fail"),
        ("RESPONSES_LEDGER_LEASE_S", "-3", "RESPONSES_LEDGER_LEASE_S='-3': takes a number over 0"),
        # it started, and every request without reasoning.effort was answered 400
        ("RESPONSES_LEDGER_DEFAULT_REASONING_EFFORT", "extreme", "takes none, minimal, low"),
        # it started, and refused every browser's request
        ("RESPONSES_LEDGER_CORS_ORIGINS", "app.example.com", "'app.example.com' is not one"),
    ],
)
def test_a_setting_that_cannot_be_used_is_said_in_one_line_before_anything_starts(
    tmp_path: Path, variable: str, value: str, said: str
) -> None:
    status, output = _refused(tmp_path, "setting", env={variable: value})
    assert status == 2
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("responses-ledger: error: "), output
    assert said in lines[0]
    assert not (tmp_path / "setting.db").exists()  # nothing started: not even the migrations


def test_the_command_line_is_checked_and_stands_in_for_the_variable_it_overrides(
    tmp_path: Path,
) -> None:
    # --log-level verbose was a traceback from the logging module
    status, output = _refused(tmp_path, "level", log_level="verbose")
    assert status == 2
    assert output.strip() == (
        "responses-ledger: error: --log-level verbose: takes critical, error, warning, info,"
        " debug or trace"
    )
    # the process's --port and --engine stand in for variables it cannot use (they were refused)
    _served(
        tmp_path,
        "overridden",
        env={"RESPONSES_LEDGER_PORT": "80a", "RESPONSES_LEDGER_ENGINE": "vLLM-0.11"},
    )


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("mysql://app:sekret@db/ledger", "mysql://app:***@db/ledger: unsupported database 'mysql'"),
        ("ledger.db", "ledger.db: Could not parse SQLAlchemy URL"),
        ("sqlite+aiosqlite://", "sqlite+aiosqlite://: in-memory SQLite is not supported"),
    ],
)
def test_a_database_url_the_server_cannot_use_is_refused_before_anything_starts(
    tmp_path: Path, url: str, said: str
) -> None:
    status, output = _refused(tmp_path, "url", url)
    assert status == 2
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert lines[0].startswith(f"responses-ledger: error: DATABASE_URL (--database-url) {said}")
    assert "sekret" not in output


def test_a_database_that_is_not_there_is_said_in_the_drivers_words(tmp_path: Path) -> None:
    url = "postgresql+asyncpg://postgres@127.0.0.1:5432/no_such_database_here"
    status, output = _refused(tmp_path, "no-such", url)
    assert status == 3
    assert "Traceback" not in output, output
    assert any(
        f"cannot open the database {url}: InvalidCatalogNameError: "
        'database \\"no_such_database_here\\" does not exist' in line
        for line in _error_lines(output)
    ), output


def test_an_unreachable_database_is_named_in_one_line_with_its_password_hidden(
    tmp_path: Path,
) -> None:
    port = free_port()  # nothing listens there
    url = f"postgresql+asyncpg://postgres:sekret@127.0.0.1:{port}/test"
    status, output = _refused(tmp_path, "no-database", url, log_level="info")
    assert status == 3
    assert "Traceback" not in output, output
    errors = _error_lines(output)
    assert any(
        f"cannot open the database postgresql+asyncpg://postgres:***@127.0.0.1:{port}/test: "
        in line
        for line in errors
    ), output
    assert "sekret" not in output
    assert "Application startup failed" in output  # uvicorn's own word follows it


def test_frontends_over_an_unreachable_database_say_so_in_one_line(tmp_path: Path) -> None:
    port = free_port()
    url = f"postgresql+asyncpg://postgres@127.0.0.1:{port}/test"
    status, output = _refused(tmp_path, "no-database-n", url, args=["--frontends", "2"])
    assert status == 3
    assert output.strip().startswith(
        f"responses-ledger: error: cannot open the database {url}: "
    ), output
    assert "Traceback" not in output, output


def test_a_sqlite_file_that_cannot_be_made_is_named_in_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    url = f"sqlite+aiosqlite:///{blocker / 'ledger.db'}"  # under a file: no directory to make it in
    status, output = _refused(tmp_path, "no-file", url)
    assert status == 3
    assert "Traceback" not in output, output
    assert any(f"cannot open the database {url}: " in line for line in _error_lines(output)), output


@pytest.mark.parametrize(
    ("engine_args", "said"),
    [
        (["--engine", "scripted"], "--engine scripted needs --script FILE"),
        (["--engine", "scripted", "--script", "/nonexistent/turns.json"], "No such file"),
    ],
)
def test_the_scripted_engine_without_a_usable_script_says_so_in_one_line(
    tmp_path: Path, engine_args: list[str], said: str
) -> None:
    status, output = _refused(tmp_path, "no-script", engine_args=engine_args)
    assert status == 3
    assert "Traceback" not in output, output
    assert any(said in line for line in _error_lines(output)), output


def test_a_script_that_is_not_json_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "turns.json"
    bad.write_text("{not json")
    status, output = _refused(
        tmp_path, "bad-script", engine_args=["--engine", "scripted", "--script", str(bad)]
    )
    assert status == 3
    assert "Traceback" not in output, output
    assert any(
        f"the scripted engine's --script {bad}: Expecting property name" in line
        for line in _error_lines(output)
    ), output


@pytest.mark.parametrize("frontends", [1, 2])
def test_a_port_in_use_is_said_in_one_line(tmp_path: Path, pg_url: str, frontends: int) -> None:
    # with several frontends the parent binds the port itself: that was OSError's traceback
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        status, output = _refused(
            tmp_path, "in-use", pg_url, port=port, args=["--frontends", str(frontends)]
        )
    assert status == 3
    assert "Traceback" not in output, output
    said = [line for line in _error_lines(output) if "in use" in line]
    assert len(said) == 1 and f"127.0.0.1', {port}" in said[0], output


def test_a_host_that_does_not_resolve_is_named(tmp_path: Path) -> None:
    # uvicorn said "[Errno -2] Name or service not known", without the name
    status, output = _refused(
        tmp_path,
        "no-host",
        args=["--host", "no-such-host.invalid"],
        env={"RESPONSES_LEDGER_RUN_OPEN": "1"},
    )
    assert status == 3
    assert (
        output.strip()
        .splitlines()[-1]
        .startswith("responses-ledger: error: cannot listen on no-such-host.invalid port ")
    ), output


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"args": ["--dtype", "float16", "--enforce-eager"]}, "--dtype, --enforce-eager: not an option of the scripted engine"),
        ({"engine_args": ["--engine", "echo", "--script", "turns.json"]}, "--script: not an option of the echo engine"),
    ],
)  # fmt: skip
def test_an_option_of_another_engine_is_refused(
    tmp_path: Path, options: dict[str, list[str]], said: str
) -> None:
    # it was ignored: a server that was not what its command line said
    status, output = _refused(tmp_path, "other-engine", **options)
    assert status == 2
    assert output.strip() == f"responses-ledger: error: {said}, which this server runs (--engine)"


def test_a_variable_of_another_engine_is_named_at_start(tmp_path: Path) -> None:
    output = _served(
        tmp_path, "unused", env={"RESPONSES_LEDGER_VLLM_GPU_MEMORY_UTILIZATION": "0.5"}
    )
    assert (
        "RESPONSES_LEDGER_VLLM_GPU_MEMORY_UTILIZATION is set, and the scripted engine runs: it is"
        " not used" in output
    )


def test_uvicorns_trace_level_is_a_log_level(tmp_path: Path) -> None:
    # --log-level trace was a ValueError from the logging module before anything started
    output = _served(tmp_path, "trace", log_level="trace")
    assert '"level": "trace"' in output  # uvicorn's ASGI messages, below debug
