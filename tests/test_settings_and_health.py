"""Configuration from the environment, and /health as a load balancer sees it."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from app.encoding import load_encoding
from app.engines.echo import EchoEngine
from app.settings import Settings
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
    assert r.status_code == 503 and r.json() == {"status": "unavailable"}
