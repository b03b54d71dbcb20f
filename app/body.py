"""Reading, parsing and checking a JSON request body: what cannot be stored or rendered is a 400.

A body is read up to ``max_body_bytes`` (413 beyond; sent compressed, ``Content-Encoding`` other
than ``identity``, a 415 that names the coding, with ``Accept-Encoding: identity``: it was read as
JSON text and refused as text that does not parse, which said nothing of why), parsed, and then
refused with a 400 that
names the parameter (``param`` is the JSON path, as pydantic's errors are written:
``metadata.k``, ``input[0].content``, ``tools[3].parameters.properties.x``) when it holds
anything that would fail later, in a place that answers 500 or harms other requests:

- a lone UTF-16 surrogate (``"\\udfff"`` as a JSON escape) in any string or key: it is not a
  Unicode character, so it cannot be encoded as UTF-8 and the store refused it (in a group
  commit shared with other responses);
- a NUL character: PostgreSQL cannot store it in text;
- a number no field can use: an integer of 20 digits or more (beyond 64 bits; Python refuses to
  parse integers over 4,300 digits at all), ``NaN``/``Infinity`` (not JSON: the store's JSON
  columns refuse them) and floats that overflow to infinity (``1e400``);
- nesting deeper than :data:`MAX_DEPTH` containers (pydantic, the prompt renderer and
  Harmony's schema rendering all recurse);
- a run of characters longer than the tokenizer takes (see :mod:`app.tokenizer_limits`);
- a body that is not a JSON object.

The checks are one walk of the parsed body, and the walk is skipped when the raw bytes prove it
would find nothing: a surrogate or a NUL needs a ``\\u`` escape, a deep body needs more than
:data:`MAX_DEPTH` brackets, a long run needs a body longer than the run; numbers are checked by
the parser's own hooks. Measured: a 68-byte body costs 3.4 µs instead of json.loads' 1.5; a
48 KB Codex turn (17,000 characters of instructions, sent every turn: their scan is cached,
see :mod:`app.tokenizer_limits`) about 2 times json.loads' 92 µs; 1 MB of one string 40-50 ms
(the run scan, in a worker thread), 1 MB of 1,100 items 3-5 ms.

Bodies above :data:`LARGE_BODY_BYTES` (64 KiB) are parsed and checked in a worker thread
(:mod:`app.offload`), so a 16 MB body does not stall the streams of other clients.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable
from typing import Any

from starlette.requests import Request

from app import offload
from app.errors import APIError, param_text
from app.tokenizer_limits import MAX_RUN, longest_run

__all__ = ["LARGE_BODY_BYTES", "MAX_DEPTH", "check_body", "json_body", "parse_body", "read_body"]

#: The deepest nesting of objects and arrays a body may have (the body itself is level 1). A
#: JSON schema of a tool's parameters 60 levels deep still fits.
MAX_DEPTH = 64
#: Bodies larger than this are parsed and checked off the event loop: a long string's run scan
#: costs about 25 ms a megabyte (``re``), so a 64 KiB one costs up to 1.6 ms; handing a body to a
#: thread costs about 0.1 ms.
LARGE_BODY_BYTES = 64 * 1024
#: An integer with this many digits is beyond 64 bits (2**64 has 20).
_MAX_INT_DIGITS = 20

_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class _BadNumber(str):
    """A number in the body that no field could use, kept as its literal text until the walk
    names the parameter that holds it."""


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body; 413 when it is (or says it is) larger than ``limit`` bytes, 415 when it is
    sent compressed."""
    coding = request.headers.get("content-encoding", "").strip()
    if coding.lower() not in ("", "identity"):
        raise APIError(
            415,
            f"The request body must be sent uncompressed: Content-Encoding '{coding}' is not "
            "supported.",
            code="unsupported_media_type",
            headers={"Accept-Encoding": "identity"},
        )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def json_body(request: Request, limit: int) -> dict[str, Any]:
    """Read, parse and check the body of ``request`` (large ones in a worker thread)."""
    raw = await read_body(request, limit)
    if len(raw) > LARGE_BODY_BYTES:
        return await offload.run(parse_body, raw)
    return parse_body(raw)


def parse_body(raw: bytes) -> dict[str, Any]:
    """Parse ``raw`` as a request body and check it (see the module docstring)."""
    bad_numbers = False

    def number(text: str) -> Any:
        nonlocal bad_numbers
        bad_numbers = True
        return _BadNumber(text)

    def parse_int(text: str) -> Any:
        return number(text) if len(text.lstrip("-")) >= _MAX_INT_DIGITS else int(text)

    def parse_float(text: str) -> Any:
        value = float(text)
        return value if math.isfinite(value) else number(text)

    try:
        body = json.loads(raw, parse_int=parse_int, parse_float=parse_float, parse_constant=number)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(
            400, f"We could not parse the JSON body of your request: {exc}", code="invalid_json"
        ) from None
    except RecursionError:
        raise _too_deep(None) from None
    if not isinstance(body, dict):
        raise APIError(400, "The request body must be a JSON object.", code="invalid_json")
    check_body(body, raw, numbers=bad_numbers)
    return body


def check_body(body: dict[str, Any], raw: bytes, *, numbers: bool = True) -> None:
    """Walk ``body`` (parsed from ``raw``) and raise the 400 for the first thing it may not
    hold; skipped when ``raw`` shows there is nothing to find. ``numbers``: the parser met a
    number that is out of range."""
    escapes = b"\\u" in raw  # surrogates and NULs can only be written as \\u escapes
    surrogates = escapes and _SURROGATE_ESCAPE.search(raw) is not None
    nul = escapes and b"\\u0000" in raw
    long = len(raw) > MAX_RUN
    deep = not long and raw.count(b"{") + raw.count(b"[") > MAX_DEPTH  # (a long body is walked)
    if not (surrogates or nul or deep or long or numbers):
        return
    checks = _Checks(surrogates=surrogates, nul=nul, long=long)
    try:
        _walk(body, 1, checks)
    except _Found as found:
        found.path.reverse()
        raise found.error(found.path) from None


class _Checks:
    __slots__ = ("long", "nul", "surrogates")

    def __init__(self, *, surrogates: bool, nul: bool, long: bool) -> None:
        self.surrogates = surrogates
        self.nul = nul
        self.long = long


class _Found(Exception):
    """Raised where the walk finds a problem; each level it unwinds adds its key to ``path``
    (so a walk that finds nothing never builds a path)."""

    def __init__(self, error: Callable[[list[str | int]], APIError]) -> None:
        self.error = error
        self.path: list[str | int] = []


def _walk(value: Any, depth: int, checks: _Checks) -> None:
    """Check the children of the container ``value`` (at nesting level ``depth``)."""
    if depth > MAX_DEPTH:
        raise _Found(_too_deep)
    every = checks.nul or checks.surrogates  # else only strings longer than a run need a look
    items = value.items() if type(value) is dict else enumerate(value)
    for key, item in items:
        try:
            if type(key) is str and (every or (checks.long and len(key) > MAX_RUN)):
                _text(key, checks, what="key")
            kind = type(item)
            if kind is str:
                if every or (checks.long and len(item) > MAX_RUN):
                    _text(item, checks, what="value")
            elif kind is dict or kind is list:
                _walk(item, depth + 1, checks)
            elif kind is _BadNumber:
                raise _Found(functools.partial(_bad_number, item))
        except _Found as found:
            found.path.append(key)
            raise


def _text(text: str, checks: _Checks, *, what: str) -> None:
    if checks.nul and "\x00" in text:
        raise _Found(functools.partial(_nul, what))
    if checks.surrogates and not text.isascii():
        found = _SURROGATE.search(text)
        if found is not None:
            raise _Found(functools.partial(_surrogate, what, ord(found.group())))
    if checks.long and len(text) > MAX_RUN:
        start = longest_run(text)
        if start is not None:
            raise _Found(functools.partial(_long_run, what, start))


def _invalid(path: list[str | int], problem: str, what: str = "value") -> APIError:
    """The 400 for the value (or key) at ``path``: ``problem`` says what is wrong with it."""
    param = param_text(path)
    return APIError(
        400, f"Invalid {what} for '{param}': {problem}", param=param, code="invalid_value"
    )


def _bad_number(literal: str, path: list[str | int]) -> APIError:
    return _invalid(
        path,
        f"the number {_clip(literal)} is out of range "
        "(integers need fewer than 20 digits; NaN and Infinity are not JSON).",
    )


def _nul(what: str, path: list[str | int]) -> APIError:
    return _invalid(path, "it contains a NUL character (\\u0000), which cannot be stored.", what)


def _surrogate(what: str, code_point: int, path: list[str | int]) -> APIError:
    return _invalid(
        path,
        f"it contains a lone UTF-16 surrogate (\\u{code_point:04x}), which is not a Unicode "
        "character and cannot be stored; send surrogates only as a valid pair.",
        what,
    )


def _long_run(what: str, start: int, path: list[str | int]) -> APIError:
    return _invalid(
        path,
        f"from character {start} on it has a run of more than {MAX_RUN} characters of one kind "
        "(letters, punctuation or whitespace) with no break, more than the tokenizer takes as "
        "one piece; break the run up.",
        what,
    )


def _clip(text: str) -> str:
    return text if len(text) <= 40 else f"{text[:20]}...{text[-10:]} ({len(text)} characters)"


def _too_large(limit: int) -> APIError:
    return APIError(
        413, f"The request body is larger than {limit} bytes.", code="request_too_large"
    )


def _too_deep(path: list[str | int] | None = None) -> APIError:
    where = f"'{param_text(path)}'" if path else "the request body"
    return APIError(
        400,
        f"Invalid value for {where}: objects and arrays are nested more than {MAX_DEPTH} deep.",
        param=param_text(path) if path else None,
        code="invalid_value",
    )
