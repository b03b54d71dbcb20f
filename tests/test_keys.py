"""app.keys (the key ring, key creation), the ``keys`` CLI, and the safe default of ``serve``:
bound to an address other than loopback with no key, it refuses to start unless run open."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from app.keys import STATIC_CALLER, KeyRing, create_key, hash_key, is_loopback, keys_required
from persistence.memory import MemoryStore
from tests.support.server import free_port


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_a_key_is_stored_only_as_its_hash_and_checked_against_it() -> None:
    store = MemoryStore()
    row, key = await create_key(store, project="alpha", role="admin", name="ci", max_streams=2)
    assert key.startswith("sk-rl-") and len(key) >= 46
    assert row.secret_hash == hash_key(key) and key not in repr(row)
    ring = KeyRing(store, required=True)
    caller = await ring.authenticate(key)
    assert caller is not None
    assert (caller.project, caller.role, caller.key_id, caller.max_streams) == (
        "alpha",
        "admin",
        row.id,
        2,
    )
    assert await ring.authenticate(key + "x") is None
    assert await ring.authenticate("") is None
    _, other = await create_key(store, project="alpha")
    assert other != key


async def test_verified_keys_are_cached_until_they_expire() -> None:
    store = MemoryStore()
    row, key = await create_key(store, project="alpha")
    clock = _Clock()
    ring = KeyRing(store, required=True, cache_s=5, clock=clock)
    assert await ring.authenticate(key) is not None
    assert await store.revoke_api_key(row.id)
    clock.now += 4.9
    assert await ring.authenticate(key) is not None  # cached: no database read
    clock.now += 0.2
    assert await ring.authenticate(key) is None  # expired, read again: revoked


async def test_unknown_keys_are_not_cached_and_the_cache_is_bounded() -> None:
    store = MemoryStore()
    keys = [(await create_key(store, project="p"))[1] for _ in range(3)]
    ring = KeyRing(store, required=True, cache_size=2)
    for key in keys:
        assert await ring.authenticate(key) is not None
    for n in range(10):
        assert await ring.authenticate(f"sk-rl-nope{n}") is None
    assert len(ring._cache) == 2


async def test_the_static_key_is_an_admin_of_the_default_project() -> None:
    ring = KeyRing(MemoryStore(), required=True, static_key="s3cret")
    assert await ring.authenticate("s3cret") is STATIC_CALLER
    assert STATIC_CALLER.project == "default" and STATIC_CALLER.role == "admin"
    assert await ring.authenticate("s3cre") is None


async def test_when_keys_are_required() -> None:
    store = MemoryStore()
    assert await keys_required(None, None, store) is False
    assert await keys_required(None, "k", store) is True
    assert await keys_required(False, "k", store) is False
    row, _ = await create_key(store, project="p")
    assert await keys_required(None, None, store) is True
    await store.revoke_api_key(row.id)
    assert await keys_required(None, None, store) is False  # only revoked keys left
    assert await keys_required(True, None, store) is True


async def test_create_key_refuses_bad_input() -> None:
    store = MemoryStore()
    for kwargs in (
        {"project": ""},
        {"project": "a b"},
        {"project": "p", "role": "root"},
        {"project": "p", "max_streams": 0},
        {"project": "p", "requests_per_minute": -1},
    ):
        with pytest.raises(ValueError):
            await create_key(store, **kwargs)  # type: ignore[arg-type]
    assert await store.list_api_keys() == []


def test_loopback_names() -> None:
    assert all(map(is_loopback, ["127.0.0.1", "127.8.9.1", "::1", "[::1]", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "10.0.0.1", "example.com"]))


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "import sys; from app.cli import main; sys.exit(main())", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **(env or {})},
    )


def test_keys_create_list_revoke(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'k.db'}"
    made = _cli(
        "keys",
        "create",
        "--project",
        "alpha",
        "--role",
        "admin",
        "--name",
        "ci",
        "--max-streams",
        "4",
        "--rpm",
        "100",
        "--database-url",
        url,
    )
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    assert key.startswith("sk-rl-") and "\n" not in key
    listed = _cli("keys", "list", "--database-url", url)
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert len(rows) == 1
    row = rows[0]
    assert (
        row["project"],
        row["role"],
        row["name"],
        row["max_streams"],
        row["requests_per_minute"],
    ) == (
        "alpha",
        "admin",
        "ci",
        4,
        100,
    )
    assert row["revoked_at"] is None and row["id"] in made.stderr
    assert (
        key not in listed.stdout and hash_key(key) not in listed.stdout and "secret_hash" not in row
    )
    assert _cli("keys", "list", "--project", "beta", "--database-url", url).stdout == ""
    revoked = _cli("keys", "revoke", row["id"], "--database-url", url)
    assert revoked.returncode == 0, revoked.stderr
    assert json.loads(_cli("keys", "list", "--database-url", url).stdout)["revoked_at"] is not None
    assert _cli("keys", "revoke", row["id"], "--database-url", url).returncode == 1
    bad = _cli("keys", "create", "--project", "no spaces", "--database-url", url)
    assert bad.returncode == 2 and "project" in bad.stderr


def _serve(tmp_path: Path, host: str, port: int, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--host", host, "--port", str(port)],
        env={
            **os.environ,
            "DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 's.db'}",
            "RESPONSES_LEDGER_LOG_LEVEL": "warning",
            **env,
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_healthy(url: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[0]
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError("the server did not become healthy")


def test_serve_on_a_public_address_without_keys_refuses_to_start(tmp_path: Path) -> None:
    proc = _serve(tmp_path, "0.0.0.0", free_port())
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "refusing to start" in output and "RESPONSES_LEDGER_RUN_OPEN" in output


def test_serve_on_a_public_address_runs_open_when_told_or_with_a_key(tmp_path: Path) -> None:
    port = free_port()
    proc = _serve(tmp_path, "0.0.0.0", port, RESPONSES_LEDGER_RUN_OPEN="true")
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", proc)
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models").status_code == 200  # open
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    port = free_port()
    proc = _serve(tmp_path, "0.0.0.0", port, RESPONSES_LEDGER_API_KEY="k-static")
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", proc)
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models").status_code == 401
        ok = httpx.get(
            f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": "Bearer k-static"}
        )
        assert ok.status_code == 200
    finally:
        proc.terminate()
        proc.communicate(timeout=60)


def test_key_settings_from_the_environment() -> None:
    from app.settings import Settings

    settings = Settings.from_env(
        {
            "RESPONSES_LEDGER_API_KEY": "k",
            "RESPONSES_LEDGER_REQUIRE_API_KEY": "false",
            "RESPONSES_LEDGER_RUN_OPEN": "yes",
            "RESPONSES_LEDGER_KEY_CACHE_S": "2.5",
            "RESPONSES_LEDGER_ALLOWED_HOSTS": "a.example, b.example",
            "RESPONSES_LEDGER_CORS_ORIGINS": "https://app.example",
        }
    )
    assert (settings.api_key, settings.require_api_key, settings.run_open) == ("k", False, True)
    assert settings.key_cache_s == 2.5
    assert settings.allowed_hosts == ("a.example", "b.example")
    assert settings.cors_origins == ("https://app.example",)
    plain = Settings.from_env({})
    assert (plain.api_key, plain.require_api_key, plain.run_open, plain.cors_origins) == (
        None,
        None,
        False,
        (),
    )
