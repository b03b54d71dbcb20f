"""Reading, parsing and checking a JSON request body: what cannot be stored or rendered is a 400.

A body is read up to ``max_body_bytes`` (413 beyond), parsed, and then refused with a 400 that
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
the parser's own hooks. So an ordinary small body costs its parse and two ``bytes`` searches.

Bodies above :data:`LARGE_BODY_BYTES` are parsed and checked in a worker thread
(:mod:`app.offload`), so a 16 MB body does not stall the streams of other clients.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from starlette.requests import Request

from app import offload
from app.errors import APIError, param_text
from app.tokenizer_limits import MAX_RUN, longest_run

__all__ = ["LARGE_BODY_BYTES", "MAX_DEPTH", "check_body", "json_body", "parse_body", "read_body"]

#: The deepest nesting of objects and arrays a body may have (the body itself is level 1). A
#: JSON schema of a tool's parameters 60 levels deep still fits.
MAX_DEPTH = 64
#: Bodies larger than this are parsed and checked off the event loop (measured: a 256 KiB body
#: parses and walks in about 1.5 ms; handing it to a thread costs about 0.1 ms).
LARGE_BODY_BYTES = 256 * 1024
#: An integer with this many digits is beyond 64 bits (2**64 has 20).
_MAX_INT_DIGITS = 20

_SURROGATE = re.compile("[\ud800-\udfff]")


class _BadNumber(str):
    """A number in the body that no field could use, kept as its literal text until the walk
    names the parameter that holds it."""


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body; 413 when it is (or says it is) larger than ``limit`` bytes."""
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
    escapes = b"\\u" in raw
    deep = raw.count(b"{") + raw.count(b"[") > MAX_DEPTH
    long = len(raw) > MAX_RUN
    if escapes or deep or long or numbers:
        _Walk(escapes=escapes, long=long).value(body, [], 1)


class _Walk:
    def __init__(self, *, escapes: bool, long: bool) -> None:
        self.escapes = escapes
        self.long = long

    def value(self, value: Any, path: list[str | int], depth: int) -> None:
        if isinstance(value, str):
            if isinstance(value, _BadNumber):
                raise APIError(
                    400,
                    f"Invalid value for '{param_text(path)}': the number {_clip(value)} is out "
                    "of range (integers need fewer than 20 digits; NaN and Infinity are not JSON).",
                    param=param_text(path),
                    code="invalid_value",
                )
            self.text(value, path)
        elif isinstance(value, dict):
            if depth > MAX_DEPTH:
                raise _too_deep(path)
            for key, item in value.items():
                path.append(key)
                self.text(key, path, key=True)
                self.value(item, path, depth + 1)
                path.pop()
        elif isinstance(value, list):
            if depth > MAX_DEPTH:
                raise _too_deep(path)
            for index, item in enumerate(value):
                path.append(index)
                self.value(item, path, depth + 1)
                path.pop()

    def text(self, text: str, path: list[str | int], *, key: bool = False) -> None:
        what = "key" if key else "value"
        if self.escapes:
            if "\x00" in text:
                raise APIError(
                    400,
                    f"Invalid {what} for '{param_text(path)}': it contains a NUL character "
                    "(\\u0000), which cannot be stored.",
                    param=param_text(path),
                    code="invalid_value",
                )
            found = _SURROGATE.search(text)
            if found is not None:
                raise APIError(
                    400,
                    f"Invalid {what} for '{param_text(path)}': it contains a lone UTF-16 "
                    f"surrogate (\\u{ord(found.group()):04x}), which is not a Unicode character "
                    "and cannot be stored; send surrogates only as a valid pair.",
                    param=param_text(path),
                    code="invalid_value",
                )
        if self.long and len(text) > MAX_RUN:
            start = longest_run(text)
            if start is not None:
                raise APIError(
                    400,
                    f"Invalid {what} for '{param_text(path)}': from character {start} on it has "
                    f"a run of more than {MAX_RUN} characters of one kind (letters, "
                    "punctuation or whitespace) with no break, more than the tokenizer takes "
                    "as one piece; break the run up.",
                    param=param_text(path),
                    code="invalid_value",
                )


def _clip(text: str) -> str:
    return text if len(text) <= 40 else f"{text[:20]}...{text[-10:]} ({len(text)} characters)"


def _too_large(limit: int) -> APIError:
    return APIError(413, f"The request body is larger than {limit} bytes.", code="request_too_large")


def _too_deep(path: list[str | int] | None) -> APIError:
    where = f"'{param_text(path)}'" if path else "the request body"
    return APIError(
        400,
        f"Invalid value for {where}: objects and arrays are nested more than {MAX_DEPTH} deep.",
        param=param_text(path) if path else None,
        code="invalid_value",
    )
