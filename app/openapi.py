"""``GET /openapi.json``: the OpenAPI 3.1 document of every route this server serves.

The document is built from the route table itself (``request.app.routes``, so it lists what is
served, never a second list kept by hand) and from :data:`OPERATIONS`, which says for each
``(method, path)`` what it takes and what it answers:

- request bodies are the edge's own pydantic models (``app.wire.CreateResponse``,
  ``app.conversations``), and which top-level fields exist at all is ``app.contract``'s table
  (``POST /v1/responses``) or ``app.input_tokens.FIELDS``: a field that the table names but the
  model does not type is any JSON value; every other field is refused, so the body schema
  allows nothing else (``additionalProperties: false``);
- query parameters are each operation's ``query``, and ``app.query`` refuses any other name
  (and the ``refused`` ones, which the document leaves out) before the route runs;
- response bodies are JSON Schemas of what the routes return (the Response object, OpenAI's
  ``{"error": {...}}``, list pages, deleted objects), written here: the server builds those as
  plain dicts. Each operation lists the error statuses it can answer; every route can also
  answer ``app.browser``'s 400 (Host), 403 (Origin) and, for a POST, 415 (not JSON, or, from
  ``app.body``, compressed); every
  ``/v1`` one 401 (keys on), 429 (a key's limits), 500 and 503 (the database unavailable,
  starting).

``tests/e2e/test_openapi.py`` keeps the document true: it asserts that every route (and method)
in the app appears in the document and nothing else does, and drives a real server with
schemathesis, failing on any 5xx and on any answer the document does not describe (status,
content type, headers, body schema), with API keys on and off.

Adding a route (the lead, on merge): add its ``Route`` to ``app.http.routes`` as usual and an
``Operation`` for each of its methods to :data:`OPERATIONS` (its schemas in :data:`SCHEMAS` when
new); :func:`document` raises :class:`Undocumented` for a route with none, and the route test
fails. A WebSocket route (``WebSocketRoute``) cannot be described by OpenAPI 3.1 and is left
out (its handshake is not an HTTP operation), and so is a route marked
``include_in_schema=False`` (the audit page ``/ui``: HTML pages for people, not an API); routes
under a ``Mount`` are described with the mount's prefix. A route that is not JSON (an HTML page, Prometheus' text format) says so with
``content_type`` and a ``{"type": "string"}`` schema.

Authentication: ``/v1`` routes take ``Authorization: Bearer KEY`` (``app.auth``). The scheme
is always declared; operations require it only when this server requires keys (the document
is built per server, at the first request), since a server that runs open takes any or none.
"""

from __future__ import annotations

import copy
import importlib.metadata
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from app.compaction import COMPACT_FIELDS
from app.contract import INCLUDES as ITEM_INCLUDES
from app.contract import PARAMETERS, RESPONSE_FIELDS
from app.conversations import CreateConversation, NewItems, UpdateConversation
from app.input_tokens import FIELDS as INPUT_TOKEN_FIELDS
from app.wire import CreateResponse

__all__ = [
    "OPERATIONS",
    "SCHEMAS",
    "Operation",
    "Query",
    "Undocumented",
    "document",
    "path_template",
    "serve",
    "served",
]

_REF = "#/components/schemas/"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF + name}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


_ID = {"type": "string", "minLength": 1}
_ITEM = {
    "type": "object",
    "required": ["id", "type"],
    "properties": {"id": {"type": "string"}, "type": {"type": "string"}},
}
#: The stream events that carry the whole Response.
_LIFECYCLE_EVENTS = (
    "response.created",
    "response.queued",
    "response.in_progress",
    "response.completed",
    "response.incomplete",
    "response.failed",
)
_METADATA = {"type": "object", "additionalProperties": {"type": "string"}}


def _list_of(item: dict[str, Any]) -> dict[str, Any]:
    """``app.wire.list_page``'s shape."""
    return {
        "type": "object",
        "required": ["object", "data", "first_id", "last_id", "has_more"],
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": item},
            "first_id": _nullable({"type": "string"}),
            "last_id": _nullable({"type": "string"}),
            "has_more": {"type": "boolean"},
        },
    }


def _deleted(kind: str) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["id", "object", "deleted"],
        "properties": {"id": _ID, "object": {"const": kind}, "deleted": {"const": True}},
    }


#: Response schemas: what the routes return (they build plain dicts; see the module docstring).
SCHEMAS: dict[str, dict[str, Any]] = {
    "Error": {
        "description": "OpenAI's error object (app.errors).",
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type", "param", "code"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": _nullable({"type": "string"}),
                    "code": _nullable({"type": "string"}),
                },
            }
        },
    },
    "Response": {
        "description": "OpenAI's Response object: every field of the SDK's model, null where "
        "unknown (app.contract.RESPONSE_FIELDS).",
        "type": "object",
        "required": list(RESPONSE_FIELDS),
        "properties": {
            "id": {"type": "string", "pattern": "^resp_"},
            "object": {"const": "response"},
            "created_at": {"type": "integer"},
            "completed_at": _nullable({"type": "integer"}),
            "status": {
                "enum": ["queued", "in_progress", "completed", "failed", "incomplete", "cancelled"]
            },
            "model": {"type": "string"},
            "output": {"type": "array", "items": _ref("OutputItem")},
            "error": _nullable(
                {
                    "type": "object",
                    "required": ["code", "message"],
                    "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
                }
            ),
            "incomplete_details": _nullable(
                {"type": "object", "properties": {"reason": {"type": "string"}}}
            ),
            "instructions": _nullable({"anyOf": [{"type": "string"}, {"type": "array"}]}),
            "metadata": _nullable(_METADATA),
            "background": _nullable({"type": "boolean"}),
            "parallel_tool_calls": {"type": "boolean"},
            "previous_response_id": _nullable({"type": "string"}),
            "tools": {"type": "array", "items": {"type": "object"}},
            "tool_choice": {"anyOf": [{"type": "string"}, {"type": "object"}]},
            "temperature": _nullable({"type": "number"}),
            "top_p": _nullable({"type": "number"}),
            "max_output_tokens": _nullable({"type": "integer"}),
            "reasoning": _nullable({"type": "object"}),
            "text": _nullable({"type": "object"}),
            "conversation": _nullable(
                {"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}}
            ),
            "usage": _nullable(
                {
                    "type": "object",
                    "required": ["input_tokens", "output_tokens", "total_tokens"],
                    "properties": {
                        "input_tokens": {"type": "integer"},
                        "output_tokens": {"type": "integer"},
                        "total_tokens": {"type": "integer"},
                    },
                }
            ),
        },
    },
    "StreamEvent": {
        "description": "One Server-Sent Event's data: a stored event of the log (its seq is "
        "the sequence_number), or the error event that ends a stream no terminal can end.",
        "type": "object",
        "required": ["type", "sequence_number"],
        "properties": {"type": {"type": "string"}, "sequence_number": {"type": "integer"}},
        "if": {"required": ["type"], "properties": {"type": {"enum": list(_LIFECYCLE_EVENTS)}}},
        "then": {"required": ["response"], "properties": {"response": _ref("Response")}},
    },
    "OutputItem": {
        "description": "An output item (message, reasoning, function_call, custom_tool_call).",
        **_ITEM,
    },
    "Item": {"description": "An input or conversation item, as stored.", **_ITEM},
    "ItemList": _list_of(_ref("Item")),
    "ResponseDeleted": _deleted("response.deleted"),
    "EventLog": {
        "description": "The raw log: the stream's events and the audit records (prompt and "
        "output token ids, finish).",
        "type": "object",
        "required": ["object", "response_id", "data", "audit"],
        "properties": {
            "object": {"const": "list"},
            "response_id": {"type": "string"},
            "data": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["seq", "type", "payload"],
                    "properties": {
                        "seq": {"type": "integer", "minimum": 0},
                        "type": {"type": "string"},
                        "payload": {"type": "object"},
                    },
                },
            },
            "audit": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["kind", "token_ids", "detail"],
                    "properties": {
                        "kind": {"type": "string"},
                        "token_ids": {"type": "array", "items": {"type": "integer"}},
                    },
                },
            },
        },
    },
    "CompactedResponse": {
        "description": "The compacted context: its user messages, then one compaction item.",
        "type": "object",
        "required": ["id", "object", "created_at", "output", "usage"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "response.compaction"},
            "created_at": {"type": "integer"},
            "output": {"type": "array", "items": _ref("Item")},
            "usage": {
                "type": "object",
                "required": ["input_tokens", "output_tokens", "total_tokens"],
                "properties": {
                    "input_tokens": {"type": "integer"},
                    "output_tokens": {"type": "integer"},
                    "total_tokens": {"type": "integer"},
                },
            },
        },
    },
    "InputTokens": {
        "type": "object",
        "required": ["object", "input_tokens"],
        "properties": {
            "object": {"const": "response.input_tokens"},
            "input_tokens": {"type": "integer", "minimum": 0},
        },
    },
    "Model": {
        "type": "object",
        "required": ["id", "object", "created", "owned_by"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "model"},
            "created": {"type": "integer"},
            "owned_by": {"type": "string"},
        },
    },
    "ModelList": {
        "type": "object",
        "required": ["object", "data"],
        "properties": {
            "object": {"const": "list"},
            "data": {
                "type": "array",
                "items": _ref("Model"),
            },
        },
    },
    "Conversation": {
        "type": "object",
        "required": ["id", "object", "created_at", "metadata"],
        "properties": {
            "id": {"type": "string", "pattern": "^conv_"},
            "object": {"const": "conversation"},
            "created_at": {"type": "integer"},
            "metadata": _nullable(_METADATA),
        },
    },
    "ConversationDeleted": _deleted("conversation.deleted"),
    "Health": {
        "type": "object",
        "required": ["status"],
        "properties": {
            "status": {"enum": ["ok", "unavailable", "draining"]},
            "reason": {"type": "string"},
        },
    },
    "OpenAPI": {"description": "This document.", "type": "object", "required": ["openapi"]},
}


@dataclass(frozen=True)
class Query:
    """A query parameter. An operation takes only the ones it lists (``app.query`` refuses any
    other name); a ``refused`` one is OpenAI's that this operation answers with a 400 saying
    why (the sentence after the name), and is left out of the document."""

    name: str
    schema: Mapping[str, Any]
    description: str = ""
    refused: str | None = None


@dataclass(frozen=True)
class Operation:
    """What one ``(method, path)`` takes and answers (see the module docstring)."""

    summary: str
    #: The 200 answer: a schema name in :data:`SCHEMAS`.
    ok: str
    #: Error statuses it answers besides the ones every route or ``/v1`` one may (see above).
    errors: tuple[int, ...] = ()
    #: The JSON body: a pydantic model (``body_fields`` restricts and extends its fields).
    body: type[BaseModel] | None = None
    body_fields: frozenset[str] | None = None
    #: Body fields that the model requires but this operation does not (missing or null: the
    #: default).
    body_optional: tuple[str, ...] = ()
    query: tuple[Query, ...] = ()
    #: ``stream=true`` (or a body with ``stream: true``) answers Server-Sent Events.
    streams: bool = False
    #: The 200 answer's media type when it is not JSON (its schema is then a string).
    content_type: str = "application/json"
    #: Also answers 503 with the ``ok`` schema (the health routes).
    unavailable_ok: bool = False
    tags: tuple[str, ...] = field(default=())
    #: OpenAPI links from the 200 answer: the operations (by ``(method, path)``) its ids feed,
    #: each with its path parameters as runtime expressions (what stateful fuzzers follow).
    links: tuple[tuple[tuple[str, str], Mapping[str, str]], ...] = ()


_RESPONSE_ID = "/v1/responses/{response_id}"
_CONVERSATION = "/v1/conversations/{conversation_id}"
_ORDER = Query("order", {"enum": ["asc", "desc"], "default": "desc"}, "Order of the items.")
_LIMIT = Query("limit", {"type": "integer", "minimum": 1, "maximum": 100, "default": 20})
_AFTER = Query("after", {"type": "string"}, "An item id: list the items after it.")
_INCLUDE = Query(
    "include",
    {"type": "array", "items": {"enum": [v for v, why in ITEM_INCLUDES.items() if why is None]}},
    "Extra fields for the items; OpenAI's other values are refused (app.conversations).",
)
#: ``include`` on a read of a response (OpenAI's retrieve and input_items.list take it).
_NO_INCLUDE = Query(
    "include",
    {"type": "array", "items": {"type": "string"}},
    refused="is not supported when reading a response: pass include when creating it (POST "
    "/v1/responses); a read returns the response as it was stored.",
)
_BODY_ERRORS = (400, 413)

#: Every operation served, by ``(method, path)`` as the route table spells the path.
OPERATIONS: dict[tuple[str, str], Operation] = {
    ("POST", "/v1/responses"): Operation(
        "Create a response (stream: true answers Server-Sent Events).",
        "Response",
        (*_BODY_ERRORS, 404),
        body=CreateResponse,
        body_fields=frozenset(p.name for p in PARAMETERS),
        streams=True,
        tags=("responses",),
        links=tuple(
            ((method, path), {"response_id": "$response.body#/id"})
            for method, path in (
                ("GET", "/v1/responses/{response_id}"),
                ("DELETE", "/v1/responses/{response_id}"),
                ("POST", "/v1/responses/{response_id}/cancel"),
                ("GET", "/v1/responses/{response_id}/input_items"),
                ("GET", "/v1/responses/{response_id}/events"),
            )
        ),
    ),
    ("POST", "/v1/responses/input_tokens"): Operation(
        "Count the tokens of the prompt a create would send; nothing is generated or stored.",
        "InputTokens",
        (*_BODY_ERRORS, 404),
        body=CreateResponse,
        body_fields=INPUT_TOKEN_FIELDS,
        body_optional=("model",),
        tags=("responses",),
    ),
    ("POST", "/v1/responses/compact"): Operation(
        "Compact a context: the model summarises it into a sealed compaction item "
        "(app.compaction); nothing is stored.",
        "CompactedResponse",
        (*_BODY_ERRORS, 404),
        body=CreateResponse,
        body_fields=COMPACT_FIELDS,
        tags=("responses",),
    ),
    ("GET", _RESPONSE_ID): Operation(
        "Retrieve a response; stream=true replays its events after starting_after, then tails.",
        "Response",
        (400, 404, 409),
        query=(
            Query("stream", {"type": "boolean", "default": False}),
            Query(
                "starting_after",
                {"type": "integer", "minimum": -1, "maximum": 2**62},
                "With stream=true: the sequence number after which to resume.",
            ),
            Query(
                "include_obfuscation",
                {"type": "boolean"},
                "Accepted (the OpenAI SDK's retrieve sends it): no obfuscation field is ever added.",
            ),
            _NO_INCLUDE,
        ),
        streams=True,
        tags=("responses",),
    ),
    ("DELETE", _RESPONSE_ID): Operation(
        "Delete a response.", "ResponseDeleted", (404,), tags=("responses",)
    ),
    ("POST", _RESPONSE_ID): Operation(
        "An action on responses this server does not serve: always 404 Invalid URL (OpenAI's "
        "actions are POSTs under /v1/responses/).",
        "Error",
        (404,),
        tags=("responses",),
    ),
    ("POST", _RESPONSE_ID + "/cancel"): Operation(
        "Cancel a background response.", "Response", (400, 404, 409), tags=("responses",)
    ),
    ("GET", _RESPONSE_ID + "/input_items"): Operation(
        "List a response's input items.",
        "ItemList",
        (400, 404),
        query=(_ORDER, _LIMIT, _AFTER, _NO_INCLUDE),
        tags=("responses",),
    ),
    ("GET", _RESPONSE_ID + "/events"): Operation(
        "The response's raw log (audit): events and prompt/output token ids.",
        "EventLog",
        (404,),
        tags=("responses", "audit"),
    ),
    ("POST", "/v1/conversations"): Operation(
        "Create a conversation.",
        "Conversation",
        _BODY_ERRORS,
        body=CreateConversation,
        tags=("conversations",),
        links=tuple(
            ((method, path), {"conversation_id": "$response.body#/id"})
            for method, path in (
                ("GET", _CONVERSATION),
                ("POST", _CONVERSATION),
                ("DELETE", _CONVERSATION),
                ("POST", _CONVERSATION + "/items"),
                ("GET", _CONVERSATION + "/items"),
            )
        ),
    ),
    ("GET", _CONVERSATION): Operation(
        "Retrieve a conversation.", "Conversation", (404,), tags=("conversations",)
    ),
    ("POST", _CONVERSATION): Operation(
        "Update a conversation's metadata.",
        "Conversation",
        (*_BODY_ERRORS, 404),
        body=UpdateConversation,
        tags=("conversations",),
    ),
    ("DELETE", _CONVERSATION): Operation(
        "Delete a conversation.", "ConversationDeleted", (404,), tags=("conversations",)
    ),
    ("POST", _CONVERSATION + "/items"): Operation(
        "Add items to a conversation.",
        "ItemList",
        (*_BODY_ERRORS, 404),
        body=NewItems,
        query=(_INCLUDE,),
        tags=("conversations",),
        links=tuple(
            (
                (method, _CONVERSATION + "/items/{item_id}"),
                {
                    "conversation_id": "$request.path.conversation_id",
                    "item_id": "$response.body#/data/0/id",
                },
            )
            for method in ("GET", "DELETE")
        ),
    ),
    ("GET", _CONVERSATION + "/items"): Operation(
        "List a conversation's items.",
        "ItemList",
        (400, 404),
        query=(_ORDER, _LIMIT, _AFTER, _INCLUDE),
        tags=("conversations",),
    ),
    ("GET", _CONVERSATION + "/items/{item_id}"): Operation(
        "Retrieve a conversation item.",
        "Item",
        (400, 404),
        query=(_INCLUDE,),
        tags=("conversations",),
    ),
    ("DELETE", _CONVERSATION + "/items/{item_id}"): Operation(
        "Delete a conversation item; answers the conversation.",
        "Conversation",
        (404,),
        tags=("conversations",),
    ),
    ("GET", "/v1/models"): Operation("The served models.", "ModelList", tags=("models",)),
    ("GET", "/v1/models/{model}"): Operation(
        "One served model (or alias) by its name; 404 model_not_found for any other.",
        "Model",
        (404,),
        tags=("models",),
    ),
    ("GET", "/health"): Operation(
        "200 when the server takes requests; 503 with the reason otherwise.",
        "Health",
        unavailable_ok=True,
        tags=("health",),
    ),
    ("GET", "/health/live"): Operation(
        "Liveness: 200 while the process answers HTTP.", "Health", tags=("health",)
    ),
    ("GET", "/health/ready"): Operation(
        "Readiness: 200 when this replica takes new responses; 503 while it starts, drains or "
        "cannot use its engine or database.",
        "Health",
        unavailable_ok=True,
        tags=("health",),
    ),
    ("GET", "/openapi.json"): Operation("This document.", "OpenAPI", tags=("meta",)),
    ("GET", "/metrics"): Operation(
        "Prometheus metrics (app.metrics), in Prometheus's text format: an admin key's when keys "
        "are on (401 without one, 403 for a member's); 404 when metrics are off.",
        "Health",
        errors=(401, 404),
        content_type="text/plain",
        tags=("meta",),
    ),
}


class Undocumented(Exception):
    """A served route has no :data:`OPERATIONS` entry."""


def served(routes: Sequence[BaseRoute], prefix: str = "") -> Iterator[tuple[str, str]]:
    """Every ``(method, path)`` the route table serves over HTTP (HEAD, which Starlette adds to
    every GET, is left out; so are WebSocket routes, and routes marked
    ``include_in_schema=False``: the audit page, HTML for people, ``app.ui``)."""
    for route in routes:
        if isinstance(route, Route):
            if not route.include_in_schema:
                continue
            for method in sorted(route.methods or ()):
                if method != "HEAD":
                    yield method, prefix + path_template(route.path)
        elif isinstance(route, Mount):
            yield from served(route.routes, prefix + route.path)


def path_template(path: str) -> str:
    """Starlette's ``{name:convertor}`` is OpenAPI's ``{name}``."""
    return "/".join(
        "{" + part[1:-1].split(":", 1)[0] + "}" if part.startswith("{") else part
        for part in path.split("/")
    )


def document(routes: Sequence[BaseRoute], *, keys_required: bool) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``routes`` (see the module docstring)."""
    models = _body_schemas()
    schemas = {**models, **SCHEMAS}
    paths: dict[str, dict[str, Any]] = {}
    for method, path in served(routes):
        operation = OPERATIONS.get((method, path))
        if operation is None:
            raise Undocumented(
                f"{method} {path} is served but has no entry in app.openapi.OPERATIONS"
            )
        paths.setdefault(path, {})[method.lower()] = _operation(
            method, path, operation, models, schemas, keys_required=keys_required
        )
    built = {
        "openapi": "3.1.0",
        "info": {
            "title": "responses-ledger",
            "version": importlib.metadata.version("responses-ledger"),
            "description": "An OpenAI-compatible Responses API server for gpt-oss in which "
            "every response is an append-only event log.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An API key (responses-ledger keys create, or "
                    "RESPONSES_LEDGER_API_KEY).",
                }
            },
        },
    }
    return copy.deepcopy(built)  # nothing shared with SCHEMAS: the caller may change it


def _body_schemas() -> dict[str, dict[str, Any]]:
    """The request body models' JSON Schemas, their ``$defs`` as components."""
    models = [
        (model, "validation")
        for model in (CreateResponse, CreateConversation, UpdateConversation, NewItems)
    ]
    _, top = models_json_schema(models, ref_template=_REF + "{model}")  # type: ignore[arg-type]
    defs: dict[str, dict[str, Any]] = top["$defs"]
    return defs


def _operation(
    method: str,
    path: str,
    op: Operation,
    models: Mapping[str, dict[str, Any]],
    schemas: dict[str, dict[str, Any]],
    *,
    keys_required: bool,
) -> dict[str, Any]:
    api = path.startswith("/v1")
    out: dict[str, Any] = {
        "operationId": _operation_id(method, path),
        "summary": op.summary,
        "tags": list(op.tags),
    }
    parameters = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in _path_names(path)
    ]
    for q in op.query:
        if q.refused is not None:  # (answered with a 400 whatever its value)
            continue
        param: dict[str, Any] = {
            "name": q.name,
            "in": "query",
            "required": False,
            "schema": dict(q.schema),
        }
        if q.description:
            param["description"] = q.description
        if q.schema.get("type") == "array":
            param["style"], param["explode"] = "form", True
        parameters.append(param)
    if parameters:
        out["parameters"] = parameters
    if op.body is not None:
        out["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _body(op, models, schemas)}},
        }
    out["responses"] = _responses(op, method, api=api, keys_required=keys_required)
    out["security"] = [{"bearer": []}] if api and keys_required else []
    return out


def _operation_id(method: str, path: str) -> str:
    words = [part.strip("{}") for part in path.split("/") if part and part != "v1"]
    return method.lower() + "_" + "_".join(w.replace(".", "_") for w in words)


def _path_names(path: str) -> list[str]:
    return [part[1:-1] for part in path.split("/") if part.startswith("{")]


def _body(
    op: Operation, models: Mapping[str, dict[str, Any]], schemas: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """The body model's schema, with exactly ``body_fields`` when given: a field the model does
    not type is any JSON value."""
    assert op.body is not None
    name = op.body.__name__
    if op.body_fields is None:
        return _ref(name)
    model = models[name]
    properties = {f: model["properties"].get(f, {}) for f in sorted(op.body_fields)}
    for f in op.body_optional:  # left out or null: the default
        properties[f] = {"anyOf": [properties[f], {"type": "null"}]}
    required = [
        f for f in model.get("required", []) if f in op.body_fields and f not in op.body_optional
    ]
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        schema["required"] = required
    if op.body_fields == frozenset(p.name for p in PARAMETERS):
        schemas[name] = schema  # the model's own schema with the contract's fields
        return _ref(name)
    return schema


def _responses(op: Operation, method: str, *, api: bool, keys_required: bool) -> dict[str, Any]:
    if op.content_type == "application/json":
        content: dict[str, Any] = {"application/json": {"schema": _ref(op.ok)}}
    else:
        content = {op.content_type: {"schema": {"type": "string"}}}
    if op.streams:
        # Server-Sent Events: each event's schema (OpenAPI 3.2 names it itemSchema; a 3.1
        # document puts it in schema, as schemathesis reads it), its data a StreamEvent
        content["text/event-stream"] = {
            "schema": {
                "type": "object",
                "required": ["event", "data"],
                "properties": {
                    "event": {"type": "string"},
                    "data": {
                        "type": "string",
                        "contentMediaType": "application/json",
                        "contentSchema": _ref("StreamEvent"),
                    },
                },
            }
        }
    responses: dict[str, Any] = {"200": {"description": op.summary, "content": content}}
    if op.links:
        responses["200"]["links"] = {
            _operation_id(*target): {
                "operationId": _operation_id(*target),
                "parameters": dict(params),
            }
            for target, params in op.links
        }
    statuses = set(op.errors) | {400, 403}  # app.browser's Host and Origin checks, on every route
    if method == "POST":
        statuses.add(415)  # not sent as application/json (app.browser), or compressed (app.body)
    if api:
        statuses |= {429, 500, 503}
        if keys_required:
            statuses.add(401)
    for status in sorted(statuses):
        answer: dict[str, Any] = {
            "description": _STATUS_TEXT[status],
            "content": {"application/json": {"schema": _ref("Error")}},
        }
        header = _STATUS_HEADERS.get(status)
        if header is not None:
            answer["headers"] = {header: {"schema": {"type": "string"}}}
        responses[str(status)] = answer
    if op.unavailable_ok:
        responses["503"] = {
            "description": "Not ready: the reason says why.",
            "content": {"application/json": {"schema": _ref(op.ok)}},
        }
    return responses


_STATUS_TEXT = {
    400: "Invalid request (the error names the parameter), or a Host header this server does "
    "not answer to.",
    403: "A browser's request from an origin CORS does not allow.",
    401: "No valid API key.",
    404: "Not found (another project's object is indistinguishable from a missing one).",
    409: "Conflicting state (not ready yet, or being generated elsewhere).",
    413: "The body is larger than the server takes.",
    415: "A body not sent with Content-Type: application/json, or sent compressed.",
    429: "The key's rate or stream limit.",
    500: "A server error.",
    503: "The database cannot be used, or the server is starting.",
}
_STATUS_HEADERS = {401: "WWW-Authenticate", 429: "Retry-After", 503: "Retry-After"}


async def serve(request: Request) -> Response:
    """``GET /openapi.json``: built once per app, at its first request."""
    state = request.app.state
    built: dict[str, Any] | None = getattr(state, "openapi", None)
    if built is None:
        ring = getattr(state, "keys", None)
        built = document(request.app.routes, keys_required=bool(ring is not None and ring.required))
        state.openapi = built
    return JSONResponse(built)
