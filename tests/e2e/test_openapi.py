"""``GET /openapi.json`` is true: it lists exactly the routes served, and schemathesis driving a
real server (API keys off, then on) finds no 5xx and no answer the document does not describe.

The fuzz run is bounded: :data:`EXAMPLES` cases per operation and server (positive and negative
data mixed; ``OPENAPI_EXAMPLES=200`` for a longer run), from a fixed seed, no shrinking. Half
the cases are pointed at objects that exist (a response, a background response, a conversation
and its item, made first), and their ``model`` is the served one, so the run reaches past the
404s and the model check. Fixed cases add the streams and app.browser's refusals.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.failures import FailureGroup
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute

from app.encoding import load_encoding
from app.engines.echo import EchoEngine
from app.http import routes
from app.openapi import OPERATIONS, Undocumented, document
from app.settings import Settings
from tests.support.server import RunningServer, serve

MODEL = "gpt-oss-echo"
KEY = "openapi-test-key"
#: Cases per operation and server: about 21 operations, two servers, a few hundred cases.
EXAMPLES = int(os.environ.get("OPENAPI_EXAMPLES", "8"))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


def _served(table: Sequence[BaseRoute] = routes, prefix: str = "") -> set[tuple[str, str]]:
    """The route table's (method, path) pairs, read here without app.openapi's help: HTTP
    routes, those under a Mount with its prefix; a WebSocket route is no HTTP operation, and
    the audit page (``include_in_schema=False``) is HTML for people, not an API."""
    pairs = set()
    for route in table:
        if isinstance(route, Mount):
            pairs |= _served(route.routes, prefix + route.path)
        elif not isinstance(route, WebSocketRoute):
            assert isinstance(route, Route), route
            if not route.include_in_schema:
                assert route.path.startswith("/ui"), (
                    f"only the audit page is left out: {route.path}"
                )
                continue
            # (Starlette's ``{name:convertor}`` is OpenAPI's ``{name}``)
            path = re.sub(r"\{(\w+):\w+\}", r"{\1}", prefix + route.path)
            pairs |= {(method, path) for method in route.methods or () if method != "HEAD"}
    return pairs


def test_every_route_and_method_is_in_the_document_and_nothing_else() -> None:
    doc = document(routes, keys_required=False)
    documented = {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}
    assert documented == _served()
    assert set(OPERATIONS) == _served()  # no entry for a route that is not served
    assert doc["openapi"] == "3.1.0"
    operations = {
        op["operationId"]: op for path_ops in doc["paths"].values() for op in path_ops.values()
    }
    linked = 0
    for op in operations.values():  # links name real operations and exactly their path ids
        for link in op["responses"]["200"].get("links", {}).values():
            target = operations[link["operationId"]]
            names = {p["name"] for p in target.get("parameters", []) if p["in"] == "path"}
            assert set(link["parameters"]) == names, link
            linked += 1
    assert linked == 12
    for schema in doc["components"]["schemas"].values():  # 3.1's Schema Object: JSON Schema 2020-12
        Draft202012Validator.check_schema(schema)


def test_a_document_shares_nothing_with_the_next_one() -> None:
    changed = document(routes, keys_required=False)
    changed["components"]["schemas"]["StreamEvent"]["properties"]["sequence_number"]["maximum"] = 0
    changed["paths"]["/v1/conversations/{conversation_id}/items"]["get"]["parameters"][-1][
        "schema"
    ]["items"]["enum"] = []
    assert document(routes, keys_required=False) != changed  # (a mutated test document leaked)


def test_a_route_without_an_operation_is_refused_not_left_out() -> None:
    async def endpoint(request: Any) -> Any:
        raise AssertionError

    with pytest.raises(Undocumented, match="GET /v1/new is served"):
        document([*routes, Route("/v1/new", endpoint, methods=["GET"])], keys_required=False)
    with pytest.raises(Undocumented, match="GET /ui/page is served"):  # under a Mount too
        document([*routes, Mount("/ui", routes=[Route("/page", endpoint)])], keys_required=False)
    # a WebSocket route is no HTTP operation: left out, not refused
    with_ws = document([*routes, WebSocketRoute("/v1/responses", endpoint)], keys_required=False)
    assert with_ws == document(routes, keys_required=False)


def test_the_request_bodies_come_from_the_wire_models_and_the_contract() -> None:
    from app.contract import PARAMETERS

    doc = document(routes, keys_required=False)
    create = doc["components"]["schemas"]["CreateResponse"]
    assert set(create["properties"]) == {p.name for p in PARAMETERS}
    assert create["additionalProperties"] is False and create["required"] == ["model"]
    assert create["properties"]["top_logprobs"] == {
        "anyOf": [{"maximum": 20, "minimum": 0, "type": "integer"}, {"type": "null"}],
        "default": None,
        "title": "Top Logprobs",
    }
    assert create["properties"]["metadata"]["maxProperties"] == 16  # check_metadata's limits
    assert doc["components"]["schemas"]["NewItems"]["properties"]["items"]["maxItems"] == 20
    count = doc["paths"]["/v1/responses/input_tokens"]["post"]["requestBody"]["content"]
    assert "required" not in count["application/json"]["schema"]  # model may be left out


def _settings(tmp_path: Path, name: str, **extra: Any) -> Settings:
    return Settings(
        engine="echo",
        database_url=f"sqlite+aiosqlite:///{tmp_path / name}",
        served_model_names=(MODEL,),
        **extra,
    )


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with serve(
        _settings(tmp_path_factory.mktemp("openapi"), "open.db"),
        engine=EchoEngine(load_encoding(), [MODEL]),
    ) as server:
        yield server


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with serve(
        _settings(tmp_path_factory.mktemp("openapi"), "keys.db", api_key=KEY),
        engine=EchoEngine(load_encoding(), [MODEL]),
    ) as server:
        yield server


def test_the_document_is_served_without_a_key_and_says_when_keys_are_needed(
    open_server: RunningServer, keyed_server: RunningServer
) -> None:
    keyed = httpx.get(keyed_server.base_url + "/openapi.json").json()  # no key: the doc is public
    opened = httpx.get(open_server.base_url + "/openapi.json").json()
    assert keyed["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": keyed["components"]["securitySchemes"]["bearer"]["description"],
    }
    create_keyed = keyed["paths"]["/v1/responses"]["post"]
    create_open = opened["paths"]["/v1/responses"]["post"]
    assert create_keyed["security"] == [{"bearer": []}] and "401" in create_keyed["responses"]
    assert create_open["security"] == [] and "401" not in create_open["responses"]
    assert keyed["paths"]["/health"]["get"]["security"] == []
    assert opened == document(open_server.app.routes, keys_required=False)


def _known(base_url: str, headers: dict[str, str]) -> dict[str, list[str]]:
    """Objects that exist, for the cases pointed at them."""
    with httpx.Client(base_url=base_url, headers=headers, timeout=60) as client:
        done = client.post("/v1/responses", json={"model": MODEL, "input": "hello"}).json()
        background = client.post(
            "/v1/responses", json={"model": MODEL, "input": "later", "background": True}
        ).json()
        conversation = client.post(
            "/v1/conversations", json={"items": [{"role": "user", "content": "hi"}]}
        ).json()
        items = client.get(f"/v1/conversations/{conversation['id']}/items").json()
    return {
        "response_id": [done["id"], background["id"]],
        "conversation_id": [conversation["id"]],
        "item_id": [item["id"] for item in items["data"]],
        "model": [MODEL],
    }


def _fuzz(
    server: RunningServer,
    key: str | None,
    *,
    document_: dict[str, Any] | None = None,
    only: tuple[str, str] | None = None,
) -> list[str]:
    """Every problem the checks find (a failing case each) over the served document's operations
    (or ``document_``'s; ``only``: one ``(METHOD, path)``)."""
    auth = {"Authorization": f"Bearer {key}"} if key else {}
    known = _known(server.base_url, auth)
    if document_ is None:
        schema = schemathesis.openapi.from_url(server.base_url + "/openapi.json")
    else:
        schema = schemathesis.openapi.from_dict(document_)
    problems: list[str] = []
    session = requests.Session()
    count = 0
    operations = [result.ok() for result in schema.get_all_operations()]
    if only is not None:
        operations = [op for op in operations if (op.method.upper(), op.path) == only]
    # deletes last, the innermost first: the objects stay for the rest
    operations.sort(key=lambda op: (op.method.upper() == "DELETE", -len(op.path)))
    for operation in operations:
        cases = st.one_of(
            operation.as_strategy(GenerationMode.POSITIVE),
            operation.as_strategy(GenerationMode.NEGATIVE),
        )

        @seed(19)
        @settings(max_examples=EXAMPLES, deadline=None, database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(case=cases, point=st.randoms(use_true_random=False))
        def one(case: schemathesis.Case, point: random.Random) -> None:
            nonlocal count
            count += 1
            headers = dict(auth)
            if point.random() < 0.5:  # at objects that exist, with the served model
                for name, ids in known.items():
                    if case.path_parameters and name in case.path_parameters:
                        case.path_parameters[name] = point.choice(ids)
                if isinstance(case.body, dict) and "model" in case.body:
                    case.body["model"] = MODEL
            elif key and point.random() < 0.3:  # no key, or a wrong one: 401
                headers = {"Authorization": "Bearer wrong"} if point.random() < 0.5 else {}
            try:
                case.call_and_validate(
                    base_url=server.base_url,
                    session=session,
                    headers=headers,
                    checks=CHECKS,
                    timeout=60,
                )
            except (Exception, FailureGroup) as exc:
                problems.append(f"{case.as_curl_command()}\n{exc}")

        one()
        for pinned in _pinned(operation, known):  # streams, which random cases rarely reach
            try:
                pinned.call_and_validate(
                    base_url=server.base_url,
                    session=session,
                    headers=auth,
                    checks=CHECKS,
                    timeout=60,
                )
            except (Exception, FailureGroup) as exc:
                problems.append(f"{pinned.as_curl_command()}\n{exc}")
    assert count >= EXAMPLES * len(operations) // 2, count  # the run reached every operation
    return problems


def _pinned(operation: Any, known: dict[str, list[str]]) -> list[schemathesis.Case]:
    """Fixed cases: the streaming answers (a created stream, a replay, a resume), and on every
    operation app.browser's refusals (an Origin; a body not sent as JSON)."""
    method, path = operation.method.upper(), operation.path
    ids = {name: ids[0] for name, ids in known.items() if "{" + name + "}" in path}
    body: dict[str, Any] = {}
    if "requestBody" in operation.definition.raw:
        body["body"] = {"model": MODEL, "input": "hi"}
    cases = [operation.Case(path_parameters=ids, headers={"Origin": "http://elsewhere"}, **body)]
    if body:
        cases.append(
            operation.Case(path_parameters=ids, headers={"Content-Type": "text/plain"}, **body)
        )
    if (method, path) == ("POST", "/v1/responses"):
        cases.append(operation.Case(body={"model": MODEL, "input": "hi", "stream": True}))
    if (method, path) == ("GET", "/v1/responses/{response_id}"):
        cases += [
            operation.Case(path_parameters={"response_id": ident}, query=query)
            for ident in known["response_id"]
            for query in ({"stream": "true"}, {"stream": "true", "starting_after": "2"})
        ]
    return cases


def test_an_answer_the_document_does_not_describe_is_found(open_server: RunningServer) -> None:
    """The harness can fail: against a document that is wrong in one place, it says so."""
    doc = document(open_server.app.routes, keys_required=False)
    # (the list's items are the Model schema: each model as the list and a retrieve show it)
    assert doc["components"]["schemas"]["ModelList"]["properties"]["data"]["items"] == {
        "$ref": "#/components/schemas/Model"
    }
    doc["components"]["schemas"]["Model"]["properties"]["owned_by"] = {"const": "someone else"}
    found = _fuzz(open_server, None, document_=doc, only=("GET", "/v1/models"))
    assert found and all("owned_by" in problem for problem in found), found[:1]
    doc = document(open_server.app.routes, keys_required=False)
    del doc["paths"]["/v1/responses/{response_id}"]["get"]["responses"]["404"]
    found = _fuzz(open_server, None, document_=doc, only=("GET", "/v1/responses/{response_id}"))
    assert found and all("404" in problem for problem in found), found[:1]
    doc = document(open_server.app.routes, keys_required=False)
    doc["components"]["schemas"]["StreamEvent"]["properties"]["sequence_number"]["maximum"] = 0
    found = _fuzz(open_server, None, document_=doc, only=("POST", "/v1/responses"))
    assert any("sequence_number" in problem for problem in found), found[:1]


@pytest.mark.slow
def test_schemathesis_finds_nothing_the_document_does_not_describe(
    open_server: RunningServer, keyed_server: RunningServer
) -> None:
    problems = _fuzz(open_server, None) + _fuzz(keyed_server, KEY)
    assert not problems, "\n\n".join(problems[:10]) + f"\n\n({len(problems)} problems)"
