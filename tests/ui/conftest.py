"""A real server for the audit page's tests: the scripted engine, a SQLite file, keys required (a
static admin key, and a member key of project ``alpha`` made in the database before the start),
and Debian's Chromium driven by Playwright (``scripts/install-chromium.sh``)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from app.encoding import load_encoding
from app.engines.scripted import ScriptedEngine
from app.keys import create_key
from app.settings import Settings
from persistence.sql import open_store
from tests.support.server import RunningServer, serve

MODEL = "gpt-oss-test"
ADMIN_KEY = "sk-rl-audit-page-admin-key"
CHROMIUM = os.environ.get("RESPONSES_LEDGER_CHROMIUM", "/usr/bin/chromium")
#: Screenshots the browser tests take (gitignored): look at them after a run.
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "ui"


@pytest.fixture(scope="session")
def ui_engine() -> ScriptedEngine:
    return ScriptedEngine(load_encoding(), [MODEL], {"turns": []})


@pytest.fixture(scope="session")
def ui_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """The database URL, and a member key of project ``alpha`` stored in it."""
    url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('ui') / 'responses.db'}"

    async def make() -> str:
        store = await open_store(url)
        try:
            _, key = await create_key(store, project="alpha", role="member")
            return key
        finally:
            await store.close()

    # in a thread of its own: Playwright's sync API keeps an event loop running in this one
    with ThreadPoolExecutor(1) as thread:
        return url, thread.submit(asyncio.run, make()).result()


@pytest.fixture(scope="session")
def ui_server(ui_db: tuple[str, str], ui_engine: ScriptedEngine) -> Iterator[RunningServer]:
    settings = Settings(
        engine="scripted",
        database_url=ui_db[0],
        served_model_names=(MODEL,),
        api_key=ADMIN_KEY,
    )
    with serve(settings, engine=ui_engine) as server:
        yield server


@pytest.fixture
def admin_client(ui_server: RunningServer) -> Iterator[OpenAI]:
    with OpenAI(
        base_url=ui_server.base_url + "/v1", api_key=ADMIN_KEY, max_retries=0, timeout=60
    ) as c:
        yield c


@pytest.fixture
def browser() -> Iterator[Any]:
    """Chromium, per test: Playwright's sync API keeps an event loop running in this thread while
    it is open, which the asyncio tests after it could not run beside."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: run scripts/install-chromium.sh (make setup-test)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # --no-sandbox: the tests may run as root in a container, where Chromium's sandbox cannot start
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Any, ui_server: RunningServer) -> Iterator[Any]:
    """A page signed in to the audit page with the admin key (HTTP Basic, as a person would)."""
    context = browser.new_context(
        http_credentials={"username": "admin", "password": ADMIN_KEY},
        base_url=ui_server.base_url,
        accept_downloads=True,
        viewport={"width": 1280, "height": 900},
    )
    context.set_default_timeout(20_000)
    try:
        yield context.new_page()
    finally:
        context.close()


def screenshot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path
