"""Configuration from the environment, and /health as a load balancer sees it."""

from __future__ import annotations

import base64
import gc
from pathlib import Path

import httpx
import pytest

from app.encoding import load_encoding
from app.engines.echo import EchoEngine
from app.main import build_engine
from app.settings import SERVE_GC_THRESHOLD, Settings, SettingsError
from app.startup import StartupError
from tests.support.server import serve


def test_settings_from_the_environment_and_the_command_line_wins() -> None:
    env = {
        "DATABASE_URL": "postgresql+asyncpg://u@h/db",
        "RESPONSES_LEDGER_PORT": "9001",
        "RESPONSES_LEDGER_ENGINE": "scripted",
        "RESPONSES_LEDGER_SERVED_MODEL_NAME": "a, b",
        "RESPONSES_LEDGER_MODEL_ALIASES": "gpt-oss=a,latest=b",
        "RESPONSES_LEDGER_RECOVER_ON_START": "false",
        "RESPONSES_LEDGER_COMMIT_WINDOW_MS": "5",
    }
    settings = Settings.from_env(env, port=9002)
    assert settings.database_url == "postgresql+asyncpg://u@h/db"
    assert settings.port == 9002  # the command line wins
    assert settings.model_names == ("a", "b")
    assert dict(settings.model_aliases) == {"gpt-oss": "a", "latest": "b"}
    assert settings.recover_on_start is False and settings.commit_window_ms == 5.0
    assert Settings.from_env({}).model_names == ("gpt-oss-echo",)
    with pytest.raises(ValueError, match="alias=model"):
        Settings.from_env({"RESPONSES_LEDGER_MODEL_ALIASES": "nonsense"})


class _DeadEngine(EchoEngine):
    def healthy(self) -> bool:
        return False


def test_health_is_503_while_the_engine_is_dead(tmp_path: Path) -> None:
    settings = Settings(engine="echo", database_url=f"sqlite+aiosqlite:///{tmp_path / 'h.db'}")
    with serve(settings, engine=_DeadEngine(load_encoding(), ["gpt-oss-echo"])) as server:
        r = httpx.get(server.base_url + "/health")
    assert r.status_code == 503 and r.json() == {
        "status": "unavailable",
        "reason": "the engine is not healthy",
    }


def test_gc_threshold_from_the_environment() -> None:
    assert Settings.from_env({"RESPONSES_LEDGER_GC_THRESHOLD": "50000,50,1000"}).gc_threshold == (
        50000,
        50,
        1000,
    )
    assert Settings.from_env({"RESPONSES_LEDGER_GC_THRESHOLD": "python"}).gc_threshold is None
    assert Settings.from_env({}).gc_threshold is None  # an in-process app leaves the GC alone
    assert (
        Settings.from_env({}, serving=True).gc_threshold == SERVE_GC_THRESHOLD
    )  # `serve` tunes it
    assert (
        Settings.from_env({"RESPONSES_LEDGER_GC_THRESHOLD": "python"}, serving=True).gc_threshold
        is None
    )
    with pytest.raises(ValueError, match="gen0,gen1,gen2"):
        Settings.from_env({"RESPONSES_LEDGER_GC_THRESHOLD": "700,10"})


def test_serve_tunes_the_gc_once_started(tmp_path: Path) -> None:
    before = gc.get_threshold()
    settings = Settings(
        engine="echo",
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'g.db'}",
        gc_threshold=(12345, 11, 13),
    )
    try:
        with serve(settings) as server:
            assert httpx.get(server.base_url + "/health").status_code == 200
            assert gc.get_threshold() == (12345, 11, 13)
            assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("RESPONSES_LEDGER_PORT", "8o00", "takes a whole number"),
        ("RESPONSES_LEDGER_LEASE_S", "3 s", "takes a number"),
        ("RESPONSES_LEDGER_RECOVER_ON_START", "flase", "takes true or false (1/0, yes/no, on/off)"),
        ("RESPONSES_LEDGER_GC_THRESHOLD", "a,b,c", "takes gen0,gen1,gen2 (three whole numbers of at least 1) or python"),
        ("RESPONSES_LEDGER_TAKEOVER", "resume", "takes continue or fail"),
        ("RESPONSES_LEDGER_ENGINE", "llama.cpp", "takes echo, scripted or vllm"),
        # words no part of the server could use: each had been taken, and failed later
        # (every request without an effort answered 400 about one it never sent; a traceback at
        # start; a browser's or a Host header's name that could never match, refusing them all)
        ("RESPONSES_LEDGER_DEFAULT_REASONING_EFFORT", "extreme", "takes none, minimal, low, medium, high, xhigh or max"),
        ("RESPONSES_LEDGER_LOG_LEVEL", "verbose", "takes critical, error, warning, info, debug or trace"),
        ("RESPONSES_LEDGER_HTTP_IMPLEMENTATION", "uvloop", "takes auto, h11 or httptools"),
        ("RESPONSES_LEDGER_REASONING_KEY", "abc", "takes 32 bytes in base64 (openssl rand -base64 32)"),
        ("RESPONSES_LEDGER_REASONING_KEY", "c2hvcnQ=", "takes 32 bytes in base64 (openssl rand -base64 32)"),
        ("RESPONSES_LEDGER_ALLOWED_HOSTS", "ledger.internal, http://ledger.internal", "takes host names without a scheme or a port (example.com, 10.0.0.5, ::1) or *; 'http://ledger.internal' is not one"),
        ("RESPONSES_LEDGER_ALLOWED_HOSTS", "ledger.internal:8000", "takes host names without a scheme or a port (example.com, 10.0.0.5, ::1) or *; 'ledger.internal:8000' is not one"),
        ("RESPONSES_LEDGER_CORS_ORIGINS", "app.example", "takes origins as a browser sends them, scheme://host[:port] without a path (https://app.example.com), or *; 'app.example' is not one"),
        ("RESPONSES_LEDGER_CORS_ORIGINS", "https://app.example/", "takes origins as a browser sends them, scheme://host[:port] without a path (https://app.example.com), or *; 'https://app.example/' is not one"),
        ("RESPONSES_LEDGER_MODEL_ALIASES", "a=gpt-oss-echo,a=gpt-oss-echo", "names the alias 'a' twice"),
        ("RESPONSES_LEDGER_MODEL_ALIASES", "=gpt-oss-echo", "takes alias=model pairs, and '=gpt-oss-echo' is not one"),
        ("RESPONSES_LEDGER_SERVED_MODEL_NAME", " , ", "takes one or more names, comma-separated"),
        ("RESPONSES_LEDGER_ALLOWED_HOSTS", ",", "takes one or more names, comma-separated"),
        ("RESPONSES_LEDGER_HOST", "0.0.0.0:8000", "takes a host name or address to listen on, without a scheme or a port (127.0.0.1, 0.0.0.0, ::, ledger.internal; the port is RESPONSES_LEDGER_PORT)"),
        ("RESPONSES_LEDGER_HOST", "http://ledger.internal", "takes a host name or address to listen on, without a scheme or a port (127.0.0.1, 0.0.0.0, ::, ledger.internal; the port is RESPONSES_LEDGER_PORT)"),
        # numbers out of their range
        ("RESPONSES_LEDGER_LEASE_S", "-1", "takes a number over 0"),
        ("RESPONSES_LEDGER_HEARTBEAT_S", "0", "takes a number over 0"),
        ("RESPONSES_LEDGER_STATEMENT_TIMEOUT_S", "nan", "takes a finite number"),
        ("RESPONSES_LEDGER_DRAIN_S", "inf", "takes a finite number"),
        ("RESPONSES_LEDGER_PORT", "70000", "takes a port number, 0 to 65535"),
        ("RESPONSES_LEDGER_FRONTENDS", "0", "takes a number of at least 1"),
        ("RESPONSES_LEDGER_SEND_BUFFER_BYTES", "0", "takes a number of at least 1"),
        ("RESPONSES_LEDGER_COMMIT_WINDOW_MS", "-0.5", "takes a number of at least 0"),
    ],
)  # fmt: skip
def test_a_value_that_cannot_be_used_is_refused_naming_its_variable(
    variable: str, value: str, said: str
) -> None:
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({variable: value})
    assert str(refused.value) == f"{variable}={value!r}: {said}"


def test_what_the_settings_take_at_their_edges() -> None:
    # a switch takes either word of each pair, in any case; nothing else (above)
    for word, meant in [("1", True), ("Yes", True), ("ON", True), ("0", False), ("no", False)]:
        assert Settings.from_env({"RESPONSES_LEDGER_METRICS": word}).metrics is meant
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({}, port=-5)  # (the command line's --port)
    assert str(refused.value) == "--port -5: takes a number of at least 0"
    # the bounds themselves, where a setting may take them
    edge = Settings.from_env(
        {"RESPONSES_LEDGER_DRAIN_S": "0", "RESPONSES_LEDGER_HTTP_MAX_CONNECTIONS": "0"}, port=0
    )
    assert (edge.drain_s, edge.http_max_connections, edge.port) == (0.0, 0, 0)


def test_a_heartbeat_no_shorter_than_the_lease_is_refused() -> None:
    with pytest.raises(
        SettingsError, match=r"HEARTBEAT_S \(1 s\) must be shorter than .*LEASE_S \(1 s"
    ):
        Settings.from_env({"RESPONSES_LEDGER_LEASE_S": "1"})  # the heartbeat's default is 1 s
    with pytest.raises(SettingsError, match="must be shorter than"):
        Settings.from_env({"RESPONSES_LEDGER_LEASE_S": "2", "RESPONSES_LEDGER_HEARTBEAT_S": "2.5"})
    fast = Settings.from_env(
        {"RESPONSES_LEDGER_LEASE_S": "1", "RESPONSES_LEDGER_HEARTBEAT_S": "0.25"}
    )
    assert (fast.lease_s, fast.heartbeat_s) == (1.0, 0.25)


def test_names_are_taken_as_the_server_compares_them() -> None:
    settings = Settings.from_env(
        {
            "RESPONSES_LEDGER_ALLOWED_HOSTS": "Ledger.Internal, [::1], 10.0.0.5, *",
            "RESPONSES_LEDGER_CORS_ORIGINS": "HTTPS://App.Example, http://localhost:5173",
            "RESPONSES_LEDGER_DEFAULT_REASONING_EFFORT": "High",
            "RESPONSES_LEDGER_LOG_LEVEL": "TRACE",
            "RESPONSES_LEDGER_REASONING_KEY": " " + base64.b64encode(bytes(range(32))).decode(),
        }
    )
    # a Host header's name: lower case, an IPv6 address without brackets (app.browser)
    assert settings.allowed_hosts == ("ledger.internal", "::1", "10.0.0.5", "*")
    # an Origin header: a browser sends its scheme and host in lower case
    assert settings.cors_origins == ("https://app.example", "http://localhost:5173")
    assert settings.default_reasoning_effort == "high"
    assert settings.log_level == "trace"
    assert Settings.from_env({"RESPONSES_LEDGER_HOST": "[::1]"}).host == "::1"  # as it binds
    assert base64.b64decode(settings.reasoning_key or "") == bytes(range(32))


def test_the_command_line_stands_in_for_a_variable_it_overrides() -> None:
    # an unusable variable that the command line overrides is not read (it was refused)
    settings = Settings.from_env(
        {"RESPONSES_LEDGER_PORT": "80OO", "RESPONSES_LEDGER_LOG_LEVEL": "loud"},
        port=8123,
        log_level="Debug",
    )
    assert (settings.port, settings.log_level) == (8123, "debug")
    # and the command line's own words are checked as the variable's are
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({}, log_level="verbose")
    assert str(refused.value) == (
        "--log-level verbose: takes critical, error, warning, info, debug or trace"
    )


@pytest.mark.parametrize(
    ("aliases", "said"),
    [
        ("latest=gpt-oss-120b", "latest=gpt-oss-120b names no served model (this server serves a, b)"),
        ("a=b", "a=b is a served model's own name"),
    ],
)  # fmt: skip
def test_an_alias_names_a_served_model_and_no_served_name(aliases: str, said: str) -> None:
    env = {"RESPONSES_LEDGER_SERVED_MODEL_NAME": "a,b", "RESPONSES_LEDGER_MODEL_ALIASES": aliases}
    with pytest.raises(SettingsError) as refused:
        Settings.from_env(env)
    assert str(refused.value) == f"RESPONSES_LEDGER_MODEL_ALIASES={aliases!r}: {said}"


def test_the_vllm_engine_without_a_model_is_refused() -> None:
    with pytest.raises(SettingsError, match=r"the vllm engine needs a model: --model"):
        Settings.from_env({"RESPONSES_LEDGER_ENGINE": "vllm"})
    assert Settings.from_env({}, engine="vllm", model="/models/gpt-oss-20b").model_names == (
        "/models/gpt-oss-20b",
    )


def test_a_vllm_variable_that_does_not_parse_stops_the_start_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (read as the engine starts; it was a ValueError's traceback through the lifespan)
    monkeypatch.setenv("RESPONSES_LEDGER_VLLM_GPU_MEMORY_UTILIZATION", "most")
    with pytest.raises(StartupError) as refused:
        build_engine(Settings(engine="vllm", model="openai/gpt-oss-20b"))
    assert str(refused.value).startswith("RESPONSES_LEDGER_VLLM_GPU_MEMORY_UTILIZATION='most': ")


def test_a_vllm_model_path_that_is_not_there_stops_the_start_in_one_line(tmp_path: Path) -> None:
    # (vLLM took it for a Hugging Face name, and its refusal was a traceback through transformers)
    missing = tmp_path / "gpt-oss-20b"
    with pytest.raises(StartupError) as refused:
        build_engine(Settings(engine="vllm", model=str(missing)))
    assert str(refused.value) == f"the model {missing}: no such file or directory"


def test_the_variables_of_another_engine_are_named_as_unused() -> None:
    env = {
        "RESPONSES_LEDGER_SCRIPT": "turns.json",
        "RESPONSES_LEDGER_VLLM_DTYPE": "float16",
        "RESPONSES_LEDGER_VLLM_ENFORCE_EAGER": "true",
        "RESPONSES_LEDGER_VLLM_SEED": "",  # (set empty: as unset)
    }
    echo = Settings.from_env(env)
    assert echo.unused_variables(env) == [
        "RESPONSES_LEDGER_SCRIPT",
        "RESPONSES_LEDGER_VLLM_DTYPE",
        "RESPONSES_LEDGER_VLLM_ENFORCE_EAGER",
    ]
    scripted = Settings.from_env({**env, "RESPONSES_LEDGER_ENGINE": "scripted"})
    assert scripted.unused_variables(env) == [
        "RESPONSES_LEDGER_VLLM_DTYPE",
        "RESPONSES_LEDGER_VLLM_ENFORCE_EAGER",
    ]
    vllm = Settings.from_env({**env, "RESPONSES_LEDGER_ENGINE": "vllm"}, model="openai/gpt-oss-20b")
    assert vllm.unused_variables(env) == ["RESPONSES_LEDGER_SCRIPT"]
