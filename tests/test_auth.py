"""app.auth.KeyAuth as an ASGI middleware: what it puts in the scope, what it answers when it
cannot check a key, and that a request's stream slots are given back however the route ends."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from app.auth import KeyAuth
from app.keys import OPEN_CALLER, KeyRing, create_key
from app.limits import CALLER, RELEASE, KeyLimits
from persistence.errors import StoreUnavailable
from persistence.memory import MemoryStore


class _Down(MemoryStore):
    async def find_api_key(self, secret_hash: str) -> Any:
        raise StoreUnavailable("the database is down")


async def _call(
    middleware: KeyAuth, app_state: Any, path: str = "/v1/models", key: str | None = None
) -> tuple[int, dict[str, str], Any]:
    headers = [(b"host", b"127.0.0.1")]
    if key is not None:
        headers.append((b"authorization", f"Bearer {key}".encode()))
    scope = {
        "type": "http",
        "method": "GET",
        "path": path,
        "headers": headers,
        "query_string": b"",
        "app": SimpleNamespace(state=app_state),
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await middleware(scope, receive, send)
    if not sent:
        return 0, {}, scope
    start = sent[0]
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, json.loads(body)


async def _inner(scope: Any, receive: Any, send: Any) -> None:
    return None


async def test_a_key_that_cannot_be_checked_is_503_with_retry_after() -> None:
    state = SimpleNamespace(keys=KeyRing(_Down(), required=True), limits=KeyLimits())
    status, headers, body = await _call(KeyAuth(_inner), state, key="sk-rl-anything")
    assert status == 503 and headers["retry-after"]
    assert body["error"]["code"] == "store_unavailable"


async def test_no_one_is_let_in_before_the_keys_are_known() -> None:
    status, _, body = await _call(KeyAuth(_inner), SimpleNamespace(limits=KeyLimits()))
    assert status == 503 and body["error"]["type"] == "server_error"


async def test_the_caller_is_in_the_scope_and_health_needs_no_key() -> None:
    store = MemoryStore()
    row, key = await create_key(store, project="alpha")
    state = SimpleNamespace(keys=KeyRing(store, required=True), limits=KeyLimits())
    status, _, scope = await _call(KeyAuth(_inner), state, key=key)
    assert status == 0 and scope[CALLER].key_id == row.id  # passed on, nothing answered here
    status, _, scope = await _call(KeyAuth(_inner), state, path="/health")
    assert status == 0 and CALLER not in scope
    open_state = SimpleNamespace(keys=KeyRing(store, required=False), limits=KeyLimits())
    status, _, scope = await _call(KeyAuth(_inner), open_state)
    assert status == 0 and scope[CALLER] is OPEN_CALLER


async def test_stream_slots_are_given_back_when_the_route_fails() -> None:
    store = MemoryStore()
    _, key = await create_key(store, project="alpha", max_streams=1)
    limits = KeyLimits()
    state = SimpleNamespace(keys=KeyRing(store, required=True), limits=limits)

    async def failing(scope: Any, receive: Any, send: Any) -> None:
        scope[RELEASE].append(limits.open_stream(scope[CALLER]))
        assert limits.streams(scope[CALLER].key_id) == 1
        raise RuntimeError("the route broke")

    with pytest.raises(RuntimeError):
        await _call(KeyAuth(failing), state, key=key)
    caller = await state.keys.authenticate(key)
    assert caller is not None and limits.streams(caller.key_id or "") == 0
