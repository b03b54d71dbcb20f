"""API keys and projects against a real server: two projects (alpha, beta), an admin of a third,
a revoked key and the static key; every route against no key, a wrong key, a revoked key,
another project's key and an admin key; per-key limits; revocation reaching a running server."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from app.encoding import load_encoding
from app.engines.scripted import ScriptedEngine
from app.keys import create_key
from app.settings import Settings
from persistence.sql import open_store
from tests.support.postgres import create_database, drop_database, unavailable
from tests.support.server import RunningServer, serve

MODEL = "gpt-oss-test"
STATIC = "static-key-for-tests"


@dataclass
class Ledger:
    server: RunningServer
    engine: ScriptedEngine
    database_url: str
    keys: dict[str, str]  # who -> key
    key_ids: dict[str, str]

    @property
    def url(self) -> str:
        return self.server.base_url

    def call(self, method: str, path: str, who: str | None, **kwargs: Any) -> httpx.Response:
        headers = kwargs.pop("headers", {})
        if who is not None:
            headers["Authorization"] = f"Bearer {self.keys.get(who, who)}"
        return httpx.request(method, self.url + path, headers=headers, timeout=30, **kwargs)


async def _make_keys(url: str) -> tuple[dict[str, str], dict[str, str]]:
    store = await open_store(url)
    keys: dict[str, str] = {}
    ids: dict[str, str] = {}
    try:
        for who, project, role, extra in (
            ("alpha", "alpha", "member", {}),
            ("beta", "beta", "member", {}),
            ("admin", "ops", "admin", {}),
            ("revoked", "alpha", "member", {}),
            ("rpm", "alpha", "member", {"requests_per_minute": 3}),
            ("streams", "alpha", "member", {"max_streams": 1}),
            ("late", "alpha", "member", {}),
        ):
            row, key = await create_key(store, project=project, role=role, name=who, **extra)
            keys[who], ids[who] = key, row.id
        assert await store.revoke_api_key(ids["revoked"])
    finally:
        await store.close()
    return keys, ids


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def ledger(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Ledger]:
    if request.param == "sqlite":
        db: Path = tmp_path_factory.mktemp("keys") / "responses.db"
        url = f"sqlite+aiosqlite:///{db}"
    else:
        reason = asyncio.run(unavailable())
        if reason is not None:
            pytest.skip(reason)
        url = asyncio.run(create_database("ledger_keys"))
    try:
        yield from _ledger(url)
    finally:
        if request.param == "postgres":
            asyncio.run(drop_database(url))


def _ledger(url: str) -> Iterator[Ledger]:
    keys, ids = asyncio.run(_make_keys(url))
    engine = ScriptedEngine(load_encoding(), [MODEL], {"turns": []})
    settings = Settings(
        engine="scripted",
        database_url=url,
        served_model_names=(MODEL,),
        api_key=STATIC,
        key_cache_s=0.3,
    )
    with serve(settings, engine=engine) as server:
        yield Ledger(server, engine, url, keys, ids)


def _stored(ledger: Ledger, rid: str) -> tuple[str, str | None] | None:
    """The response's (project, api_key_id) as the database has it, or None."""

    async def read() -> tuple[str, str | None] | None:
        store = await open_store(ledger.database_url, migrate=False)
        try:
            row = await store.get(rid)
            return None if row is None else (row.project, row.api_key_id)
        finally:
            await store.close()

    return asyncio.run(read())


def _chained_onto(ledger: Ledger, rid: str) -> int:
    async def count() -> int:
        engine = create_async_engine(ledger.database_url)
        try:
            async with engine.connect() as conn:
                query = text("SELECT count(*) FROM responses WHERE previous_response_id = :rid")
                return int((await conn.execute(query, {"rid": rid})).scalar_one())
        finally:
            await engine.dispose()

    return asyncio.run(count())


def _create(ledger: Ledger, who: str, **body: Any) -> dict[str, Any]:
    r = ledger.call("POST", "/v1/responses", who, json={"model": MODEL, "input": "hi", **body})
    assert r.status_code == 200, r.text
    return dict(r.json())


def _routes(rid: str) -> list[tuple[str, str, dict[str, Any]]]:
    """Every /v1 route that names a response, as (method, path, request kwargs)."""
    return [
        ("GET", f"/v1/responses/{rid}", {}),
        ("GET", f"/v1/responses/{rid}", {"params": {"stream": "true"}}),
        ("GET", f"/v1/responses/{rid}", {"params": {"stream": "true", "starting_after": "2"}}),
        ("GET", f"/v1/responses/{rid}/input_items", {}),
        ("GET", f"/v1/responses/{rid}/events", {}),
        ("POST", f"/v1/responses/{rid}/cancel", {}),
        (
            "POST",
            "/v1/responses",
            {"json": {"model": MODEL, "input": "x", "previous_response_id": rid}},
        ),
        ("DELETE", f"/v1/responses/{rid}", {}),
    ]


def _error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


def test_no_key_wrong_key_and_revoked_key_are_401_on_every_route(ledger: Ledger) -> None:
    rid = _create(ledger, "alpha", background=True)["id"]
    for who in (None, "sk-rl-wrong", "revoked"):
        for method, path, kwargs in [
            *_routes(rid),
            ("GET", "/v1/models", {}),
            ("POST", "/v1/responses", {"json": {"model": MODEL, "input": "x"}}),
        ]:
            r = ledger.call(method, path, who, **kwargs)
            error = _error(r, 401)
            assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"
            assert r.headers["www-authenticate"].startswith("Bearer")
            assert ledger.keys.get(who or "", "never") not in r.text  # the key is never echoed
    for header in (f"Basic {ledger.keys['alpha']}", "Bearer", ledger.keys["alpha"]):
        _error(httpx.get(ledger.url + "/v1/models", headers={"Authorization": header}), 401)
    assert httpx.get(ledger.url + "/health").status_code == 200  # no key needed
    assert ledger.call("GET", f"/v1/responses/{rid}", "alpha").status_code == 200  # still there


def test_another_projects_response_is_exactly_a_missing_one(ledger: Ledger) -> None:
    rid = _create(ledger, "alpha", background=True)["id"]
    missing = "resp_" + "0" * 48
    for who in ("beta", "admin", STATIC):
        for (method, path, kwargs), (_, missing_path, missing_kwargs) in zip(
            _routes(rid), _routes(missing), strict=True
        ):
            if who != "beta" and path.endswith("/events"):
                continue  # admins (the static key is one) read every project's audit endpoint
            theirs = ledger.call(method, path, who, **kwargs)
            absent = ledger.call(method, missing_path, who, **missing_kwargs)
            assert theirs.status_code == absent.status_code == 404, (who, method, path, theirs.text)
            assert theirs.text.replace(rid, "ID") == absent.text.replace(missing, "ID"), (who, path)
    # nothing changed: alpha still reads it whole, and nothing was chained or deleted
    assert ledger.call("GET", f"/v1/responses/{rid}", "alpha").json()["status"] == "completed"
    assert _chained_onto(ledger, rid) == 0


def test_another_projects_item_is_exactly_a_missing_one(ledger: Ledger) -> None:
    """An item_reference (in a create and in a token count) to an item of another project's
    response answers what a reference to a missing id answers; the owner's resolves."""
    first = _create(ledger, "alpha", input=[{"role": "user", "content": "ALPHA-SECRET"}])
    items = [first["output"][-1]["id"]]
    listed = ledger.call("GET", f"/v1/responses/{first['id']}/input_items", "alpha").json()
    items.append(listed["data"][0]["id"])
    missing = "msg_" + "0" * 48
    for item in items:
        for path in ("/v1/responses", "/v1/responses/input_tokens"):
            body = {"model": MODEL, "input": [{"type": "item_reference", "id": item}]}
            absent_body = {"model": MODEL, "input": [{"type": "item_reference", "id": missing}]}
            theirs = ledger.call("POST", path, "beta", json=body)
            absent = ledger.call("POST", path, "beta", json=absent_body)
            assert _error(theirs, 400)["param"] == "input[0].id"
            _error(absent, 400)
            assert theirs.text.replace(item, "ID") == absent.text.replace(missing, "ID")
            assert ledger.call("POST", path, "alpha", json=body).status_code == 200, path
    beta = OpenAI(base_url=ledger.url + "/v1", api_key=ledger.keys["beta"], max_retries=0)
    with beta, pytest.raises(openai.BadRequestError):
        beta.responses.input_tokens.count(
            model=MODEL, input=[{"type": "item_reference", "id": items[1]}]
        )


def test_the_owner_reaches_every_route(ledger: Ledger) -> None:
    first = _create(ledger, "alpha", background=True)
    rid = first["id"]
    assert _stored(ledger, rid) == ("alpha", ledger.key_ids["alpha"])
    expected = {f"/v1/responses/{rid}/cancel": 400}  # it completed: nothing to cancel
    for method, path, kwargs in _routes(rid):
        r = ledger.call(method, path, "alpha", **kwargs)
        assert r.status_code == expected.get(path, 200), (method, path, r.text)
        if r.status_code == 400:
            assert "Cannot cancel" in r.json()["error"]["message"]
        if path == "/v1/responses":
            chained = r.json()["id"]
    # the chained turn belongs to alpha too, and the DELETE (last) removed the first
    assert _stored(ledger, chained) == ("alpha", ledger.key_ids["alpha"])
    assert ledger.call("GET", f"/v1/responses/{rid}", "alpha").status_code == 404
    assert _stored(ledger, rid) is None


def test_admin_reads_every_projects_audit_but_nothing_else(ledger: Ledger) -> None:
    rid = _create(ledger, "beta")["id"]
    events = ledger.call("GET", f"/v1/responses/{rid}/events", "admin")
    assert events.status_code == 200 and events.json()["response_id"] == rid
    assert ledger.call("GET", f"/v1/responses/{rid}", "admin").status_code == 404
    # alpha, a member, may not read beta's audit
    assert ledger.call("GET", f"/v1/responses/{rid}/events", "alpha").status_code == 404
    # the admin's own responses belong to its project
    own = _create(ledger, "admin")["id"]
    assert ledger.call("GET", f"/v1/responses/{own}", "beta").status_code == 404
    assert ledger.call("GET", f"/v1/responses/{own}", "admin").status_code == 200


def test_the_static_key_is_the_default_project(ledger: Ledger) -> None:
    rid = _create(ledger, STATIC)["id"]
    assert _stored(ledger, rid) == ("default", None)
    assert ledger.call("GET", f"/v1/responses/{rid}", "alpha").status_code == 404
    assert ledger.call("GET", "/v1/models", STATIC).status_code == 200


def test_a_key_revoked_while_the_server_runs_stops_working(ledger: Ledger) -> None:
    assert ledger.call("GET", "/v1/models", "late").status_code == 200  # verified and cached

    async def revoke() -> None:
        store = await open_store(ledger.database_url, migrate=False)
        try:
            assert await store.revoke_api_key(ledger.key_ids["late"])
        finally:
            await store.close()

    asyncio.run(revoke())
    deadline = time.monotonic() + 10
    while ledger.call("GET", "/v1/models", "late").status_code == 200:
        assert time.monotonic() < deadline, "the revoked key still works after 10 s"
        time.sleep(0.1)
    assert _error(ledger.call("GET", "/v1/models", "late"), 401)["code"] == "invalid_api_key"


def test_requests_per_minute_limit(ledger: Ledger) -> None:
    for _ in range(3):
        assert ledger.call("GET", "/v1/models", "rpm").status_code == 200
    r = ledger.call("GET", "/v1/models", "rpm")
    error = _error(r, 429)
    assert error["code"] == "rate_limit_exceeded"
    assert 1 <= int(r.headers["retry-after"]) <= 60
    r = ledger.call("POST", "/v1/responses", "rpm", json={"model": MODEL, "input": "x"})
    assert r.status_code == 429
    assert ledger.call("GET", "/v1/models", "alpha").status_code == 200  # other keys unaffected


def test_concurrent_streams_limit(ledger: Ledger) -> None:
    slow = "<|channel|>final<|message|>" + "word " * 60 + "<|return|>"
    ledger.engine.add_turns({"completion": slow, "token_delay_ms": 40})
    body = {"model": MODEL, "input": "slow", "stream": True}
    headers = {"Authorization": f"Bearer {ledger.keys['streams']}"}
    with httpx.Client(base_url=ledger.url, headers=headers, timeout=30) as http:
        with http.stream("POST", "/v1/responses", json=body) as first:
            assert first.status_code == 200
            lines = first.iter_lines()
            first_event = next(line for line in lines if line.startswith("data: "))
            rid = json.loads(first_event[6:])["response"]["id"]
            second = http.post("/v1/responses", json={**body, "input": "again"})
            assert _error(second, 429)["code"] == "rate_limit_exceeded"
            assert second.headers["retry-after"]
            resume = http.get(f"/v1/responses/{rid}", params={"stream": "true"})
            assert resume.status_code == 429
            # a request that is not a stream is not limited by streams
            assert (
                http.post("/v1/responses", json={"model": MODEL, "input": "plain"}).status_code
                == 200
            )
            for _ in lines:  # read it to the end: the slot is given back when it ends
                pass
        again = http.post("/v1/responses", json={**body, "input": "after"})
        assert again.status_code == 200, again.text


def test_a_conversation_is_its_projects_alone(ledger: Ledger) -> None:
    """Another project's conversation (an admin's included) answers exactly what a missing one
    does, on every route and as a response's ``conversation``."""
    user = {"type": "message", "role": "user", "content": "secret"}
    r = ledger.call("POST", "/v1/conversations", "alpha", json={"items": [user]})
    assert r.status_code == 200, r.text
    conv = r.json()["id"]
    item = ledger.call("GET", f"/v1/conversations/{conv}/items", "alpha").json()["data"][0]["id"]
    assert ledger.call("POST", "/v1/conversations", None, json={}).status_code == 401

    def answers(who: str, ident: str) -> list[tuple[int, Any]]:
        calls = [
            ("GET", f"/v1/conversations/{ident}", {}),
            ("POST", f"/v1/conversations/{ident}", {"json": {"metadata": {"k": "v"}}}),
            ("GET", f"/v1/conversations/{ident}/items", {}),
            ("POST", f"/v1/conversations/{ident}/items", {"json": {"items": [user]}}),
            ("GET", f"/v1/conversations/{ident}/items/{item}", {}),
            ("DELETE", f"/v1/conversations/{ident}/items/{item}", {}),
            ("DELETE", f"/v1/conversations/{ident}", {}),
            (
                "POST",
                "/v1/responses",
                {"json": {"model": MODEL, "input": "x", "conversation": ident}},
            ),
        ]
        out = []
        for method, path, kwargs in calls:
            response = ledger.call(method, path, who, **kwargs)
            body = response.json()
            body["error"]["message"] = body["error"]["message"].replace(ident, "ID")
            out.append((response.status_code, body))
        return out

    missing = answers("beta", "conv_" + "0" * 48)
    assert {status for status, _ in missing} == {404}
    assert answers("beta", conv) == missing
    assert answers("admin", conv) == missing
    # and alpha's conversation is untouched
    items = ledger.call("GET", f"/v1/conversations/{conv}/items", "alpha").json()["data"]
    assert [i["content"][0]["text"] for i in items] == ["secret"]
    assert ledger.call("GET", f"/v1/conversations/{conv}", "alpha").json()["metadata"] == {}
