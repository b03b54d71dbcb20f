"""Routes through the OpenAI SDK: an unknown path is an OpenAI-shaped 404 (the SDK's
``NotFoundError``), a known path asked with a wrong method a 405 with ``Allow``."""

from __future__ import annotations

import httpx
import openai
import pytest
from openai import OpenAI

from tests.support.server import RunningServer


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("post", "/responses/frobnicate"),  # an action on responses this server does not serve
        ("post", "/responses/resp_123"),
        ("post", "/responses/resp_123/nothing"),
        ("get", "/nothing"),
        ("post", "/chat/nothing"),
        ("get", "/responses/resp_123/input_items/extra"),
    ],
)
def test_unknown_paths_are_not_found(client: OpenAI, method: str, path: str) -> None:
    call = client.post if method == "post" else client.get
    kwargs = {"body": {}} if method == "post" else {}
    with pytest.raises(openai.NotFoundError) as caught:
        call(path, cast_to=httpx.Response, **kwargs)  # type: ignore[operator]
    assert caught.value.body == {
        "message": f"Invalid URL ({method.upper()} /v1{path})",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", "/v1/responses", "POST"),
        ("GET", "/v1/responses/resp_123/cancel", "POST"),
        ("POST", "/v1/models", "GET, HEAD"),
        ("PUT", "/v1/responses/resp_123", "GET, HEAD, DELETE"),
        ("GET", "/v1/responses/input_tokens", None),  # a response id: 404 (no such response)
    ],
)
def test_a_wrong_method_on_a_known_path_is_405(
    ledger: RunningServer, client: OpenAI, method: str, path: str, allowed: str | None
) -> None:
    response = httpx.request(method, ledger.base_url + path, json={}, timeout=30)
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    if allowed is None:
        assert response.status_code == 404
        return
    assert response.status_code == 405, response.text
    assert set(response.headers["allow"].split(", ")) == set(allowed.split(", "))
    assert error["type"] == "invalid_request_error" and method in error["message"]
    call = {"GET": client.get, "POST": client.post, "PUT": client.put}[method]
    with pytest.raises(openai.APIStatusError) as caught:  # the SDK sees the same
        call(path.removeprefix("/v1"), cast_to=httpx.Response)
    assert caught.value.status_code == 405 and caught.value.body["message"] == error["message"]  # type: ignore[index]
