"""Fuzzing the HTTP edge: random and mutated requests, and what the server answers (issue 14).

    python -m bench.fuzz                    # 20,000 requests against a fresh server (echo engine)
    python -m bench.fuzz --requests 2000 --seed 7

The generator (:func:`requests`, a Hypothesis strategy) is the one ``tests/e2e/test_fuzz.py``
runs in CI, bounded. It sends ``POST /v1/responses`` bodies that are valid requests with random
field values, wrong types, unknown fields, strings with lone surrogates, NULs and long runs,
numbers no field can use (huge integers, ``NaN``, ``1e400``), deep nesting, random input items
and tools, and byte-level mutations of all of those; and random path ids and query strings for
the GET/DELETE/cancel/input_items/events routes. :func:`send` sends one on a keep-alive client
and :func:`problem` says what is wrong with the answer: any 5xx, a 4xx whose body is not
OpenAI-shaped, a dropped connection.

Prints the count of answers by status, and every 5xx or malformed answer.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

__all__ = ["FuzzRequest", "Outcome", "problem", "requests", "send"]

MODEL = "gpt-oss-fuzz"


@dataclass(frozen=True)
class FuzzRequest:
    method: str
    path: str  # already percent-encoded
    query: str = ""
    body: bytes | None = None

    def describe(self) -> str:
        body = "" if self.body is None else f" body={self.body[:300]!r}"
        return f"{self.method} {self.path}{'?' + self.query if self.query else ''}{body}"


@dataclass
class Outcome:
    status: int | None
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    dropped: str | None = None


# -- values ----------------------------------------------------------------------------------

_WEIRD_CHARS = [
    "\udfff",
    "\ud800",
    "\x00",
    "\x01",
    "\u2028",
    "\ufeff",
    "😀",
    "中",
    "é",
    "\\",
    '"',
    "\n",
    " ",
]
_TEXT = st.one_of(
    st.text(max_size=20),
    st.lists(st.sampled_from([*_WEIRD_CHARS, "a", "b", " "]), max_size=12).map("".join),
    st.sampled_from(["", "hi", "a" * 5000, " " * 5000, "!" * 4097, "resp_x", "<|end|>", "\\u0000"]),
)
_NUMBER_LITERALS = st.sampled_from(
    ["1" * 25, "-" + "9" * 30, "1" * 5000, "NaN", "Infinity", "-Infinity", "1e400", "-1e999",
     "18446744073709551616", "9223372036854775808", "0", "-1", "1.5", "2", "1e-400", "100000"]
)  # fmt: skip
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    _TEXT,
)


def _json(depth: int = 3) -> st.SearchStrategy[Any]:
    return st.recursive(
        _SCALARS,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(_TEXT, inner, max_size=4)
        ),
        max_leaves=12,
    )


_ANY = _json()


def _nested(levels: int) -> Any:
    value: Any = "x"
    for i in range(levels):
        value = [value] if i % 2 else {"a": value}
    return value


_DEEP = st.integers(1, 120).map(_nested)
_VALUE = st.one_of(_ANY, _ANY, _DEEP)

_ITEM_TYPES = [
    "message", "function_call", "function_call_output", "reasoning", "item_reference",
    "custom_tool_call", "custom_tool_call_output", "no_such_item",
]  # fmt: skip


@st.composite
def _item(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from([*_ITEM_TYPES, None]))
    item: dict[str, Any] = {} if kind is None else {"type": kind}
    if draw(st.booleans()):
        item["role"] = draw(
            st.sampled_from(["user", "assistant", "system", "developer", "tool", "x"])
        )
    if draw(st.booleans()):
        item["content"] = draw(
            st.one_of(
                _TEXT,
                st.lists(
                    st.fixed_dictionaries(
                        {
                            "type": st.sampled_from(
                                ["input_text", "output_text", "input_image", "x"]
                            ),
                            "text": _VALUE,
                        }
                    ),
                    max_size=3,
                ),
                _VALUE,
            )
        )
    for key in draw(st.lists(st.sampled_from(["id", "call_id", "name", "arguments", "output", "summary",
                                               "encrypted_content", "input", "status"]), max_size=4)):  # fmt: skip
        item[key] = draw(st.one_of(_TEXT, _VALUE))
    return item if draw(st.integers(0, 9)) else draw(_VALUE)


@st.composite
def _tool(draw: st.DrawFn) -> Any:
    tool: dict[str, Any] = {
        "type": draw(st.sampled_from(["function", "custom", "web_search", "x", 3]))
    }
    if draw(st.booleans()):
        tool["name"] = draw(_TEXT)
    if draw(st.booleans()):
        tool["description"] = draw(_TEXT)
    if draw(st.booleans()):
        tool["parameters"] = draw(
            st.one_of(
                st.just({"type": "object", "properties": {"x": {"type": "string"}}}),
                _DEEP.map(lambda v: {"type": "object", "properties": {"x": v}}),
                _VALUE,
            )
        )
    if draw(st.booleans()):
        tool["format"] = draw(_VALUE)
    return tool if draw(st.integers(0, 9)) else draw(_VALUE)


_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "instructions": st.one_of(_TEXT, _VALUE),
    "previous_response_id": st.one_of(_TEXT, _VALUE),
    "stream": st.one_of(st.booleans(), _VALUE),
    "store": st.one_of(st.booleans(), _VALUE),
    "background": st.one_of(st.booleans(), _VALUE),
    "tools": st.one_of(st.lists(_tool(), max_size=3), _VALUE),
    "tool_choice": st.one_of(
        st.sampled_from(["auto", "none", "required"]),
        _VALUE,
        st.fixed_dictionaries({"type": st.just("function"), "name": _TEXT}),
    ),
    "max_output_tokens": st.one_of(st.integers(-5, 50), _VALUE),
    "temperature": st.one_of(st.floats(-1, 3), _VALUE),
    "top_p": st.one_of(st.floats(-1, 2), _VALUE),
    "reasoning": st.one_of(
        st.fixed_dictionaries({"effort": st.sampled_from(["low", "high", "x"])}), _VALUE
    ),
    "include": st.one_of(st.lists(st.sampled_from(["reasoning.encrypted_content", "x"])), _VALUE),
    "metadata": st.one_of(st.dictionaries(_TEXT, _TEXT, max_size=3), _VALUE),
    "parallel_tool_calls": _VALUE,
    "text": st.one_of(st.just({"format": {"type": "text"}}), _VALUE),
    "user": _VALUE,
    "truncation": st.one_of(st.sampled_from(["auto", "disabled"]), _VALUE),
    "top_logprobs": st.one_of(st.integers(-1, 25), _VALUE),
    "max_tool_calls": _VALUE,
    "stream_options": _VALUE,
    "seed": st.one_of(st.integers(-(2**64), 2**64), _VALUE),
    "service_tier": _VALUE,
}


_SAFE_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), max_size=20)
_GOOD: dict[str, st.SearchStrategy[Any]] = {
    "instructions": _SAFE_TEXT,
    "stream": st.booleans(),
    "store": st.booleans(),
    "background": st.booleans(),
    "tools": st.just(
        [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}]
    ),
    "tool_choice": st.sampled_from(["auto", "none"]),
    "max_output_tokens": st.integers(1, 40),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0, 1),
    "reasoning": st.fixed_dictionaries({"effort": st.sampled_from(["low", "medium", "high"])}),
    "metadata": st.dictionaries(st.text("abc", max_size=5), _SAFE_TEXT, max_size=3),
    "seed": st.integers(-(2**63), 2**63 - 1),
    "user": _SAFE_TEXT,
    "truncation": st.sampled_from(["auto", "disabled"]),
}


@st.composite
def _create_body(draw: st.DrawFn) -> bytes:
    if draw(st.booleans()):  # a valid request with valid random values, then maybe one bad one
        good: dict[str, Any] = {
            "model": MODEL,
            "input": draw(
                st.one_of(
                    _SAFE_TEXT,
                    st.lists(
                        st.fixed_dictionaries(
                            {
                                "role": st.sampled_from(["user", "assistant", "developer"]),
                                "content": _SAFE_TEXT,
                            }
                        ),
                        min_size=1,
                        max_size=3,
                    ),
                )
            ),
        }
        for name in draw(st.lists(st.sampled_from(sorted(_GOOD)), max_size=4, unique=True)):
            good[name] = draw(_GOOD[name])
        if draw(st.integers(0, 2)) == 0:
            name = draw(st.sampled_from([*sorted(_FIELDS), "input", "zz"]))
            good[name] = draw(_FIELDS.get(name, _VALUE))
        return json.dumps(good).encode()
    body: dict[str, Any] = {}
    if draw(st.integers(0, 9)):
        body["model"] = draw(st.sampled_from([MODEL, MODEL, MODEL, "gpt-oss-nope", ""]) | _VALUE)
    if draw(st.integers(0, 9)):
        body["input"] = draw(st.one_of(_TEXT, st.lists(_item(), max_size=4), _VALUE))
    for name in draw(st.lists(st.sampled_from(sorted(_FIELDS)), max_size=5, unique=True)):
        body[name] = draw(_FIELDS[name])
    for _ in range(draw(st.integers(0, 2))):
        body[draw(_TEXT)] = draw(_VALUE)  # unknown fields
    raw = json.dumps(body)  # lone surrogates are written as \\udxxx escapes, NaN as NaN
    if draw(st.integers(0, 5)) == 0:  # a number literal json.dumps will not write, somewhere
        literal = draw(_NUMBER_LITERALS)
        target = draw(
            st.sampled_from(["max_output_tokens", "seed", "temperature", "top_p", "zz", "metadata"])
        )
        raw = raw[:-1] + (", " if len(raw) > 2 else "") + f'"{target}": {literal}}}'
    data = raw.encode()
    mutation = draw(st.integers(0, 12))
    if mutation == 0 and data:  # cut short
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif mutation == 1 and data:  # one byte changed
        at = draw(st.integers(0, len(data) - 1))
        data = data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1 :]
    elif mutation == 2:  # bytes inserted
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.binary(max_size=8)) + data[at:]
    elif mutation == 3:  # not an object at all
        data = draw(
            st.sampled_from(
                [b"[]", b"null", b"3", b'"x"', b"", b"\xff\xfe", b"[" * 3000, b"{" * 50]
            )
        )
    return data


_PATH_IDS = st.one_of(
    st.text(min_size=1, max_size=30).map(lambda s: quote(s, safe="")),
    st.binary(min_size=1, max_size=12).map(lambda b: quote(b, safe="")),
    st.sampled_from(
        [
            "resp_x",
            "resp_%00x",
            "%00",
            "resp_%ED%A0%80",
            "r" * 300,
            "%2F",
            "..",
            "resp_%FF",
            "%0A%0D",
        ]
    ),
)
_QUERY_KEYS = ["stream", "starting_after", "limit", "order", "after", "include", "include[]", "zz"]
_QUERY_VALUES = st.one_of(
    st.sampled_from(
        [
            "true",
            "false",
            "1",
            "0",
            "-1",
            "3",
            "asc",
            "desc",
            "",
            "9" * 30,
            "1_0",
            " 5",
            "\u0663",
            "reasoning.encrypted_content",
            "%00",
            "x",
        ]
    ),
    st.text(max_size=8),
)


@st.composite
def _read_request(draw: st.DrawFn, known_ids: list[str]) -> FuzzRequest:
    route, method = draw(
        st.sampled_from(
            [
                ("", "GET"),
                ("", "DELETE"),
                ("/cancel", "POST"),
                ("/input_items", "GET"),
                ("/events", "GET"),
                ("", "POST"),
                ("/input_items", "DELETE"),
            ]
        )
    )
    # draws the same whatever known_ids holds (Hypothesis insists on that)
    use_known, index, random_id = draw(st.booleans()), draw(st.integers(0, 49)), draw(_PATH_IDS)
    ident = known_ids[index % len(known_ids)] if use_known and known_ids else random_id
    pairs = draw(st.lists(st.tuples(st.sampled_from(_QUERY_KEYS), _QUERY_VALUES), max_size=3))
    query = "&".join(f"{quote(k, safe='[]')}={quote(v, safe='%')}" for k, v in pairs)
    return FuzzRequest(method, f"/v1/responses/{ident}{route}", query)


def requests(known_ids: list[str]) -> st.SearchStrategy[FuzzRequest]:
    """One fuzzed request; ``known_ids`` (ids of responses that exist) is read when drawing, so
    the caller may add to it as responses are made."""
    return st.one_of(
        _create_body().map(lambda body: FuzzRequest("POST", "/v1/responses", body=body)),
        _create_body().map(lambda body: FuzzRequest("POST", "/v1/responses", body=body)),
        _read_request(known_ids),
        st.sampled_from(["/v1/models", "/health", "/v1/nothing", "/v1/responses"]).map(
            lambda p: FuzzRequest("GET", p)
        ),
    )


# -- sending and judging ---------------------------------------------------------------------


def send(client: httpx.Client, request: FuzzRequest) -> Outcome:
    url = request.path + ("?" + request.query if request.query else "")
    headers = {"content-type": "application/json"} if request.body is not None else {}
    try:
        with client.stream(request.method, url, content=request.body, headers=headers) as response:
            body = response.read()
            return Outcome(response.status_code, body, dict(response.headers))
    except (
        httpx.RemoteProtocolError,
        httpx.ReadError,
        httpx.WriteError,
        httpx.ConnectError,
    ) as exc:
        return Outcome(None, dropped=f"{type(exc).__name__}: {exc}")


def problem(outcome: Outcome) -> str | None:
    """What is wrong with an answer, or None."""
    if outcome.status is None:
        return f"dropped connection ({outcome.dropped})"
    if outcome.status >= 500:
        return f"{outcome.status}: {outcome.body[:500]!r}"
    if outcome.status >= 400:
        try:
            error = json.loads(outcome.body)["error"]
        except (ValueError, KeyError, TypeError):
            return f"{outcome.status} that is not an OpenAI error: {outcome.body[:300]!r}"
        if not (
            isinstance(error, dict)
            and isinstance(error.get("message"), str)
            and isinstance(error.get("type"), str)
            and all(
                k in error and (error[k] is None or isinstance(error[k], str))
                for k in ("param", "code")
            )
        ):
            return f"{outcome.status} with a malformed error: {outcome.body[:300]!r}"
    if outcome.status == 200 and outcome.headers.get("content-type", "").startswith(
        "application/json"
    ):
        try:
            data = json.loads(outcome.body)
        except ValueError:
            return f"200 whose body is not JSON: {outcome.body[:300]!r}"
        if (
            isinstance(data, dict)
            and data.get("object") == "response"
            and isinstance(data.get("id"), str)
        ):
            return None
    return None


def remember(outcome: Outcome, known_ids: list[str]) -> None:
    """Keep the id of a response the server made, so later reads can ask for it."""
    if outcome.status == 200 and outcome.body.startswith(b'{"id":"resp_') and len(known_ids) < 50:
        known_ids.append(outcome.body[7:60].decode())


# -- the benchmark ---------------------------------------------------------------------------


def run(base_url: str, count: int, seed_value: int) -> tuple[collections.Counter[str], list[str]]:
    counts: collections.Counter[str] = collections.Counter()
    problems: list[str] = []
    known: list[str] = []
    with httpx.Client(base_url=base_url, timeout=60) as client:

        @seed(seed_value)
        @settings(max_examples=count, deadline=None, database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(requests(known))
        def one(request: FuzzRequest) -> None:
            outcome = send(client, request)
            counts[str(outcome.status) if outcome.status is not None else "dropped"] += 1
            remember(outcome, known)
            found = problem(outcome)
            if found is not None:
                problems.append(f"{found}\n    for {request.describe()}")

        one()
    return counts, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--database-url", help="default: a fresh SQLite file")
    args = parser.parse_args(argv)

    from bench.harness import _free_port, _Server
    from bench.targets import REPO_ROOT

    with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp:
        workdir = Path(tmp)
        port = _free_port()
        database_url = args.database_url or f"sqlite+aiosqlite:///{workdir / 'responses.db'}"
        argv_ = [
            sys.executable, "-c", "import sys; from app.cli import main; sys.exit(main())",
            "serve", "--engine", "echo", "--served-model-name", MODEL, "--database-url", database_url,
            "--host", "127.0.0.1", "--port", str(port),
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "RESPONSES_LEDGER_LOG_LEVEL": "warning"}
        server = _Server(argv_, env, workdir / "server.log")
        try:
            server.wait_ready(port, 120)
            base = f"http://127.0.0.1:{port}"
            while httpx.get(base + "/health").status_code != 200:
                time.sleep(0.1)
            start = time.monotonic()
            counts, problems = run(base, args.requests, args.seed)
            elapsed = time.monotonic() - start
        finally:
            tail = server.log_tail(4000)
            server.stop()
    total = sum(counts.values())
    print(f"{total} requests in {elapsed:.0f} s (seed {args.seed})")
    for status, n in sorted(counts.items()):
        print(f"  {status}: {n}")
    print(f"problems: {len(problems)}")
    for text in problems[:50]:
        print("  " + text)
    if problems and "Traceback" in tail:
        print("server log tail:\n" + tail)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
