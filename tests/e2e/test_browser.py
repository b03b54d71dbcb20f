"""What a web page can make a browser send to the server (app.browser): a cross-origin
``text/plain`` or form POST (415, nothing stored), a DNS-rebound Host (400), a foreign Origin
(403, no CORS headers); and CORS when it is configured."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.encoding import load_encoding
from app.engines.echo import EchoEngine
from app.settings import Settings
from tests.support.server import RunningServer, serve

MODEL = "gpt-oss-echo"
BODY = b'{"model": "gpt-oss-echo", "input": "from a web page"}'


def _server(tmp_path: Path, **settings: Any) -> Any:
    return serve(
        Settings(
            engine="echo", database_url=f"sqlite+aiosqlite:///{tmp_path / 'b.db'}", **settings
        ),
        engine=EchoEngine(load_encoding(), [MODEL]),
    )


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Loopback, no keys, nothing configured: as ``make serve`` runs."""
    with _server(tmp_path_factory.mktemp("browser")) as server:
        yield server


def _code(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    return str(r.json()["error"]["code"])


def test_a_body_that_is_not_json_is_415_and_stores_nothing(local: RunningServer) -> None:
    url = local.base_url + "/v1/responses"
    before = local.stored_responses()
    for content_type in (
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        None,
    ):
        headers = {"Content-Type": content_type} if content_type else {}
        assert (
            _code(httpx.post(url, content=BODY, headers=headers), 415) == "unsupported_media_type"
        )
    assert local.stored_responses() == before
    ok = httpx.post(url, content=BODY, headers={"Content-Type": "application/json; charset=utf-8"})
    assert ok.status_code == 200, ok.text
    assert local.stored_responses() == before + 1
    rid = ok.json()["id"]
    # a POST without a body (cancel) needs no content type
    assert httpx.post(f"{url}/{rid}/cancel").status_code == 400  # not background, not 415


def test_only_loopback_host_names_when_bound_to_loopback(local: RunningServer) -> None:
    port = local.base_url.rsplit(":", 1)[1]
    for host in ("attacker.example", f"attacker.example:{port}", "127.0.0.1.nip.io", ""):
        r = httpx.get(local.base_url + "/v1/models", headers={"Host": host})
        assert _code(r, 400) == "invalid_host"
    assert _code(httpx.get(local.base_url + "/health", headers={"Host": "attacker.example"}), 400)
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "LOCALHOST"):
        assert (
            httpx.get(local.base_url + "/v1/models", headers={"Host": host}).status_code == 200
        ), host


def test_no_cors_by_default_and_a_foreign_origin_is_refused(local: RunningServer) -> None:
    url = local.base_url + "/v1/responses"
    before = local.stored_responses()
    for origin in ("https://attacker.example", "null", "http://localhost:3000"):
        posted = httpx.post(
            url, content=BODY, headers={"Origin": origin, "Content-Type": "application/json"}
        )
        assert _code(posted, 403) == "origin_not_allowed"
        assert "access-control-allow-origin" not in posted.headers
        preflight = httpx.options(
            url, headers={"Origin": origin, "Access-Control-Request-Method": "POST"}
        )
        assert (
            preflight.status_code >= 400 and "access-control-allow-origin" not in preflight.headers
        )
    assert local.stored_responses() == before
    plain = httpx.get(local.base_url + "/v1/models")
    assert plain.status_code == 200 and "access-control-allow-origin" not in plain.headers


def test_configured_cors_origins_and_hosts(tmp_path: Path) -> None:
    app_origin = "https://app.example"
    with _server(
        tmp_path,
        cors_origins=(app_origin,),
        allowed_hosts=("ledger.internal", "127.0.0.1"),
        api_key="k-browser",
    ) as server:
        url = server.base_url + "/v1/responses"
        preflight = httpx.options(
            url,
            headers={
                "Origin": app_origin,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type",
            },
        )
        assert preflight.status_code == 200, preflight.text  # answered before the key check
        assert preflight.headers["access-control-allow-origin"] == app_origin
        assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
        posted = httpx.post(
            url,
            content=BODY,
            headers={
                "Origin": app_origin,
                "Content-Type": "application/json",
                "Authorization": "Bearer k-browser",
            },
        )
        assert posted.status_code == 200, posted.text
        assert posted.headers["access-control-allow-origin"] == app_origin
        unauthorized = httpx.get(server.base_url + "/v1/models", headers={"Origin": app_origin})
        assert _code(unauthorized, 401) == "invalid_api_key"
        other = httpx.get(
            server.base_url + "/v1/models", headers={"Origin": "https://other.example"}
        )
        assert _code(other, 403) == "origin_not_allowed"
        port = server.base_url.rsplit(":", 1)[1]
        authorized = {"Authorization": "Bearer k-browser"}
        assert (
            httpx.get(
                server.base_url + "/v1/models",
                headers={**authorized, "Host": f"ledger.internal:{port}"},
            ).status_code
            == 200
        )
        assert (
            _code(
                httpx.get(
                    server.base_url + "/v1/models", headers={**authorized, "Host": "localhost"}
                ),
                400,
            )
            == "invalid_host"
        )
    with _server(tmp_path, allowed_hosts=("*",)) as anyhost:
        assert (
            httpx.get(
                anyhost.base_url + "/v1/models", headers={"Host": "whatever.example"}
            ).status_code
            == 200
        )
