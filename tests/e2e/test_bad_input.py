"""Bad input is a 400 that names the parameter, never a 500; an unexpected 500 is OpenAI-shaped
JSON on a connection that stays usable (issue 14, point 4), over a real socket."""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from app.encoding import load_encoding
from app.engines.scripted import ScriptedEngine
from app.openapi import OPERATIONS
from app.settings import Settings
from persistence.memory import MemoryStore
from tests.e2e.conftest import MODEL
from tests.support import postgres
from tests.support.server import RunningServer, serve

HEAD = '{"model": "' + MODEL + '", "input": "hi", '


def _error(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == "application/json"
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return dict(body["error"])


def _post_raw(ledger: RunningServer, raw: str | bytes) -> httpx.Response:
    content = raw.encode() if isinstance(raw, str) else raw
    return httpx.post(
        ledger.base_url + "/v1/responses",
        content=content,
        headers={"content-type": "application/json"},
        timeout=60,
    )


def _nested_schema(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


# Raw JSON texts: json.dumps would refuse to write some of these (and writes \udfff as is).
@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (HEAD + '"metadata": {"k": "\\udfff"}}', "metadata.k"),
        (HEAD + '"metadata": {"\\udfff": "v"}}', "metadata.\\udfff"),
        (HEAD + '"no_such_field": {"x": ["ok", "a\\ud800b"]}}', "no_such_field.x[1]"),
        (
            '{"model": "' + MODEL + '", "input": [{"role": "user", "content": "\\ud83d"}]}',
            "input[0].content",
        ),
        (HEAD + '"user": "a\\u0000b"}', "user"),
        (HEAD + '"metadata": {"a\\u0000": "v"}}', "metadata.a\\x00"),
        (HEAD + '"max_output_tokens": ' + "1" * 5000 + "}", "max_output_tokens"),
        (HEAD + '"seed": 123456789012345678901234}', "seed"),
        (HEAD + '"extra": [1, -99999999999999999999]}', "extra[1]"),
        (HEAD + '"temperature": NaN}', "temperature"),
        (HEAD + '"top_p": -Infinity}', "top_p"),
        (HEAD + '"top_p": 1e400}', "top_p"),
        (HEAD + '"seed": 18446744073709551615}', "seed"),  # 20 digits: beyond any field
        (HEAD + '"seed": 9223372036854775808}', "seed"),  # 19 digits, beyond the 64-bit seed
        (
            HEAD
            + '"tools": '
            + json.dumps([{"type": "function", "name": "f", "parameters": _nested_schema(100)}])
            + "}",
            "tools[0].parameters.properties.a.properties",
        ),
        (HEAD + '"deep": ' + "[" * 100 + "]" * 100 + "}", "deep" + "[0]" * 62),
        ('{"model": "' + MODEL + '", "input": "' + "a" * 5000 + '"}', "input"),
        ('{"model": "' + MODEL + '", "input": "x ' + "!" * 5000 + '"}', "input"),
        (
            '{"model": "' + MODEL + '", "instructions": "' + "\\n" * 5000 + '", "input": "hi"}',
            "instructions",
        ),
        (
            '{"model": "'
            + MODEL
            + '", "input": [{"role": "user", "content": [{"type": "input_text", "text": "'
            + "中" * 5000
            + '"}]}]}',
            "input[0].content[0].text",
        ),
    ],
    ids=lambda v: v if len(v) < 40 else v[:37] + "...",
)
def test_what_cannot_be_stored_or_rendered_is_a_400_naming_the_parameter(
    ledger: RunningServer, raw: str, param: str
) -> None:
    error = _error(_post_raw(ledger, raw), 400)
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "invalid_value"
    assert error["param"] is not None and error["param"].startswith(param), error


def test_json_too_deep_for_the_parser_is_a_400(ledger: RunningServer) -> None:
    error = _error(_post_raw(ledger, "[" * 200_000 + "]" * 200_000), 400)
    assert error["param"] is None and "nested" in error["message"]


def test_what_is_fine_stays_fine(ledger: RunningServer, engine: ScriptedEngine) -> None:
    """The checks do not refuse what can be stored and rendered: a valid surrogate pair, a run
    of exactly the limit, numbers within range, a tool schema nested to nearly the limit, the
    text "\\u0000" written with an escaped backslash."""
    tool = {"type": "function", "name": "f", "parameters": _nested_schema(28)}  # 61 levels deep
    body = (
        '{"model": "' + MODEL + '", "input": "smile \\ud83d\\ude00 ' + "a" * 4096 + '", '
        '"seed": 9223372036854775807, "metadata": {"k": "\\\\u0000"}, "temperature": 1.5e-3, '
        '"tools": ' + json.dumps([tool]) + "}"
    )
    r = _post_raw(ledger, body)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "completed"
    assert r.json()["metadata"] == {"k": "\\u0000"}


def test_a_panic_inside_harmony_is_a_400_about_the_input() -> None:
    """A megabyte of spaces makes openai-harmony panic (``PanicException``, a BaseException);
    the body check refuses such runs first, and this is the net behind it (input replayed from a
    previous response is not a body)."""
    from app.errors import APIError
    from app.prompting import render_checked
    from domain.prompt import PromptRequest

    request = PromptRequest(instructions=None, items=" " * 1_048_576, reasoning_effort="low")
    with pytest.raises(APIError) as caught:
        render_checked(load_encoding(), request, 201088)
    assert caught.value.status == 400 and caught.value.param == "input"


@pytest.mark.parametrize(
    ("path", "params", "status", "param"),
    [
        ("", {"stream": "banana"}, 400, "stream"),
        ("", {"stream": "true", "starting_after": "abc"}, 400, "starting_after"),
        ("", {"stream": "true", "starting_after": "1_0"}, 400, "starting_after"),
        ("", {"stream": "true", "starting_after": "9" * 5000}, 400, "starting_after"),
        ("", {"starting_after": "3"}, 400, "starting_after"),
        ("", {"include": "reasoning.encrypted_content"}, 400, "include"),
        ("/input_items", {"limit": "\u0663"}, 400, "limit"),
        ("/input_items", {"limit": " 5"}, 400, "limit"),
        ("/input_items", {"order": "\x00"}, 400, "order"),
    ],
)
def test_query_parameters_are_checked(
    ledger: RunningServer, path: str, params: dict[str, str], status: int, param: str
) -> None:
    """On a response that exists (a missing one is 404 before its parameters are looked at, so
    that it cannot be told from another project's)."""
    made = httpx.post(
        ledger.base_url + "/v1/responses", json={"model": MODEL, "input": "hi"}, timeout=30
    )
    assert made.status_code == 200, made.text
    url = f"{ledger.base_url}/v1/responses/{made.json()['id']}{path}"
    error = _error(httpx.get(url, params=params), status)
    assert error["param"] == param


def test_every_operation_refuses_a_query_parameter_it_does_not_take(
    ledger: RunningServer,
) -> None:
    """A name the route does not know was ignored (a typo's ``starting_afer`` replayed the whole
    log): now OpenAI's 400 ``unknown_parameter``, before the route runs, on every documented
    operation (``app.query``; the document lists what each takes)."""
    made = httpx.post(
        ledger.base_url + "/v1/responses", json={"model": MODEL, "input": "hi"}, timeout=30
    ).json()
    for (method, path), operation in OPERATIONS.items():
        url = ledger.base_url + path.format(
            response_id=made["id"], conversation_id="conv_x", item_id="msg_x", model=MODEL
        )
        # (the first name it does not take is the one named: ``stream`` where it takes none)
        takes_stream = any(q.name == "stream" for q in operation.query)
        for params, name in (
            ({"starting_afer": "3"}, "starting_afer"),
            (
                {"stream": "true", "starting_afer": "3"},
                "starting_afer" if takes_stream else "stream",
            ),
        ):
            answer = httpx.request(
                method, url, params=params, json={"model": MODEL, "input": "hi"}, timeout=30
            )
            error = _error(answer, 400)
            assert (error["param"], error["code"]) == (name, "unknown_parameter"), (method, path)
            assert error["message"] == f"Unrecognized request argument supplied: {name}"
    # POST /v1/responses with stream=true in the query (it belongs in the body)
    error = _error(
        httpx.post(
            ledger.base_url + "/v1/responses",
            params={"stream": "true"},
            json={"model": MODEL, "input": "hi"},
        ),
        400,
    )
    assert error["param"] == "stream"


@pytest.mark.parametrize(
    ("path", "query", "param", "says"),
    [
        ("", "stream=true&stream=false", "stream", "given more than once"),
        ("", "stream=true&starting_after=1&starting_after=2", "starting_after", "more than once"),
        ("/input_items", "limit=1&limit=50", "limit", "given more than once"),
        ("/input_items", "limit[]=1", "limit[]", "Unrecognized request argument"),
        ("", "include[]=reasoning.encrypted_content", "include", "when creating it"),
        ("/input_items", "include=message.input_image.image_url", "include", "when creating"),
        ("", "include_obfuscation=maybe", "include_obfuscation", "expected 'true' or 'false'"),
    ],
)
def test_a_query_parameter_given_twice_or_refused_says_why(
    ledger: RunningServer, path: str, query: str, param: str, says: str
) -> None:
    made = httpx.post(
        ledger.base_url + "/v1/responses", json={"model": MODEL, "input": "hi"}, timeout=30
    ).json()
    answer = httpx.get(f"{ledger.base_url}/v1/responses/{made['id']}{path}?{query}")
    error = _error(answer, 400)
    assert error["param"] == param and says in error["message"], error


def test_the_sdk_query_parameters_taken_and_refused(client: OpenAI) -> None:
    """Through the OpenAI SDK: what its methods send is taken (``include_obfuscation`` on a
    retrieve, a conversation's ``include`` as ``include[]``, pages' ``after``/``limit``/``order``),
    and an ``extra_query`` the route does not take is a 400 naming it."""
    response = client.responses.create(model=MODEL, input="hi")
    assert client.responses.retrieve(response.id, include_obfuscation=False).id == response.id
    streamed = client.responses.retrieve(
        response.id, stream=True, starting_after=1, include_obfuscation=True
    )
    numbers = [event.sequence_number for event in streamed]
    assert numbers and numbers[0] == 2
    page = client.responses.input_items.list(response.id, limit=1, order="asc")
    assert len(page.data) == 1
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.retrieve(response.id, extra_query={"starting_afer": 3})
    assert caught.value.body["param"] == "starting_afer"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.input_items.list(response.id, include=["message.input_image.image_url"])
    assert "when creating it" in caught.value.message
    conversation = client.conversations.create(
        items=[{"type": "message", "role": "user", "content": "hello"}]
    )
    items = client.conversations.items.list(
        conversation.id, include=["message.input_image.image_url"], limit=5, order="asc"
    )
    assert [item.type for item in items.data] == ["message"]
    with pytest.raises(openai.BadRequestError) as caught:
        client.conversations.retrieve(conversation.id, extra_query={"include": "x"})
    assert caught.value.body["param"] == "include"  # type: ignore[index]


def test_a_compressed_body_is_415_and_says_so(ledger: RunningServer) -> None:
    """A gzip body was read as JSON text: a 400 "could not parse the JSON body ... can't decode
    byte 0x8b", which said nothing of why. Every route that reads a body reads it the same way
    (``app.body``)."""
    url = ledger.base_url + "/v1/responses"
    body = json.dumps({"model": MODEL, "input": "compressed"}).encode()
    before = ledger.stored_responses()
    json_type = {"Content-Type": "application/json"}
    for coding, content in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))):
        answer = httpx.post(url, content=content, headers={**json_type, "Content-Encoding": coding})
        assert _error(answer, 415)["code"] == "unsupported_media_type"
        assert f"Content-Encoding '{coding}' is not supported" in answer.json()["error"]["message"]
        assert answer.headers["accept-encoding"] == "identity"
    conversation = httpx.post(
        ledger.base_url + "/v1/conversations",
        content=gzip.compress(b"{}"),
        headers={**json_type, "Content-Encoding": "gzip"},
    )
    assert _error(conversation, 415)["code"] == "unsupported_media_type"
    assert ledger.stored_responses() == before
    plain = httpx.post(url, content=body, headers={**json_type, "Content-Encoding": "identity"})
    assert plain.status_code == 200, plain.text
    assert ledger.stored_responses() == before + 1


IMPOSSIBLE_IDS = ["resp_%00x", "resp_%01", "%0A", "r" * 300, "resp_%E2%80%A8x"]


def _ids_are_404s(base_url: str, known: str) -> None:
    url = base_url + "/v1/responses/"
    missing = _error(httpx.get(url + "resp_missing"), 404)
    for ident in IMPOSSIBLE_IDS:
        for method, suffix, params in [
            ("GET", "", {}),
            ("GET", "", {"stream": "true"}),
            ("DELETE", "", {}),
            ("POST", "/cancel", {}),
            ("GET", "/input_items", {}),
            ("GET", "/events", {}),
        ]:
            error = _error(httpx.request(method, url + ident + suffix, params=params), 404)
            assert {k: error[k] for k in ("type", "param", "code")} == {
                k: missing[k] for k in ("type", "param", "code")
            }, (ident, method, suffix)
    error = _error(httpx.get(url + known + "/input_items", params={"after": "msg\x00"}), 404)
    assert "msg" in error["message"]


def test_a_path_id_that_cannot_exist_is_a_404_like_a_missing_one(ledger: RunningServer) -> None:
    known = httpx.post(
        ledger.base_url + "/v1/responses", json={"model": MODEL, "input": "hi"}
    ).json()["id"]
    _ids_are_404s(ledger.base_url, known)


@pytest.mark.postgres
def test_a_path_id_that_cannot_exist_is_a_404_on_postgresql() -> None:
    reason = asyncio.run(postgres.unavailable())
    if reason:
        pytest.skip(reason)
    url = asyncio.run(postgres.create_database("ledger_bad_ids"))
    try:
        engine = ScriptedEngine(load_encoding(), [MODEL], {"turns": []})
        settings = Settings(engine="scripted", database_url=url, served_model_names=(MODEL,))
        with serve(settings, engine=engine) as server:
            known = httpx.post(
                server.base_url + "/v1/responses", json={"model": MODEL, "input": "hi"}
            ).json()["id"]
            _ids_are_404s(server.base_url, known)
    finally:
        asyncio.run(postgres.drop_database(url))


class _Broken(BaseException):
    """Not an Exception: passes every ``except Exception`` (as pyo3's PanicException does)."""


class _BrokenStore(MemoryStore):
    """A store whose reads fail in ways no handler expects."""

    async def get(self, response_id: str) -> Any:
        if response_id == "resp_runtime":
            raise RuntimeError("the store is broken")
        if response_id == "resp_base":
            raise _Broken("deeper trouble")
        return await super().get(response_id)


@pytest.fixture(scope="module")
def broken() -> Iterator[RunningServer]:
    engine = ScriptedEngine(load_encoding(), [MODEL], {"turns": []})
    with serve(
        Settings(engine="scripted", served_model_names=(MODEL,)),
        engine=engine,
        store=_BrokenStore(),
    ) as server:
        yield server


@pytest.mark.parametrize("ident", ["resp_runtime", "resp_base"])
def test_an_unexpected_500_is_json_and_keeps_the_connection(
    broken: RunningServer, ident: str, caplog: pytest.LogCaptureFixture
) -> None:
    with httpx.Client(
        base_url=broken.base_url, limits=httpx.Limits(max_connections=1), timeout=30
    ) as client:
        first = client.get("/v1/models")
        port = first.extensions["network_stream"].get_extra_info("client_addr")[1]
        with caplog.at_level("ERROR"):
            error = _error(client.get(f"/v1/responses/{ident}"), 500)
        assert error["type"] == "server_error"
        assert "broken" not in error["message"] and "trouble" not in error["message"]  # not leaked
        errors = [r for r in caplog.records if r.levelname == "ERROR" and r.name != "app.requests"]
        assert [r.exc_info is not None for r in errors] == [True]  # once, with its traceback
        # and the request's own line (app.logs), at ERROR for a 500, naming the response
        lines = [r for r in caplog.records if r.name == "app.requests"]
        assert [(r.levelname, r.http_status, r.response_id) for r in lines] == [
            ("ERROR", 500, ident)
        ]  # type: ignore[attr-defined]
        after = client.get("/v1/models")  # the same connection, still usable
        assert after.status_code == 200
        assert after.extensions["network_stream"].get_extra_info("client_addr")[1] == port
        again = client.post("/v1/responses", json={"model": MODEL, "input": "hi"})
        assert again.status_code == 200 and again.json()["status"] == "completed"
