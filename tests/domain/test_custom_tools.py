"""The custom-tool shim: the function a custom tool is offered as, and unwrapping its arguments."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from openai.types.responses import CustomToolParam

from domain.custom_tools import (
    INPUT_KEY,
    CustomInputStream,
    custom_tool_as_function,
    decode_custom_input,
    encode_custom_input,
)
from domain.errors import InvalidInput

SCHEMA = {
    "type": "object",
    "properties": {
        "input": {"type": "string", "description": "The tool's entire input, as one string."}
    },
    "required": ["input"],
    "additionalProperties": False,
}
CALL_LINE = 'Call it with a JSON object {"input": "..."} whose "input" string is the whole input.'


def _stream(chunks: Sequence[str]) -> str:
    """The concatenated deltas of feeding ``chunks`` one by one, then finishing."""
    stream = CustomInputStream()
    deltas = [stream.feed(chunk) for chunk in chunks]
    deltas.append(stream.finish())
    return "".join(deltas)


def _split(text: str, cuts: Sequence[int]) -> list[str]:
    points = sorted({min(max(c, 0), len(text)) for c in cuts})
    bounds = [0, *points, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


# -- the offered function ------------------------------------------------------------------------


LARK = 'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF'


@pytest.mark.parametrize(
    ("fmt", "format_lines"),
    [
        pytest.param(None, ["The input is free-form text."], id="no-format"),
        pytest.param({"type": "text"}, ["The input is free-form text."], id="text"),
        pytest.param(
            {"type": "grammar", "syntax": "lark", "definition": LARK},
            ["The input must follow this Lark grammar:", "```lark", *LARK.split("\n"), "```"],
            id="lark",
        ),
        pytest.param(
            {"type": "grammar", "syntax": "regex", "definition": r"^\d{3}-\d{4}$"},
            ["The input must match this regular expression:", r"^\d{3}-\d{4}$"],
            id="regex",
        ),
        pytest.param(
            {"type": "grammar", "syntax": "ebnf", "definition": "a ::= 'x'"},
            ["The input must follow this ebnf grammar:", "```ebnf", "a ::= 'x'", "```"],
            id="other-syntax",
        ),
        pytest.param(
            {"type": "json_lines"},
            ['The input must follow this format: {"type": "json_lines"}'],
            id="unknown-format",
        ),
    ],
)
def test_custom_tool_is_a_function_of_one_string(fmt: object, format_lines: list[str]) -> None:
    tool: dict[str, object] = {
        "type": "custom",
        "name": "apply_patch",
        "description": "Edit files.",
    }
    if fmt is not None:
        tool["format"] = fmt
    name, description, schema = custom_tool_as_function(tool)
    assert name == "apply_patch"
    # a Lark or regex grammar's payload is written raw, held to the grammar (domain.constraints)
    raw = (
        isinstance(fmt, dict)
        and fmt.get("type") == "grammar"
        and fmt.get("syntax") in ("lark", "regex")
    )
    call_line = (
        "Write the input itself as the message of the call, not wrapped in JSON."
        if raw
        else CALL_LINE
    )
    assert description.split("\n") == ["Edit files.", call_line, *format_lines]
    assert schema == SCHEMA


def test_custom_tool_from_the_sdk_type_without_description() -> None:
    tool: CustomToolParam = {"type": "custom", "name": "run_sql"}
    name, description, schema = custom_tool_as_function(tool)
    assert (name, description) == ("run_sql", f"{CALL_LINE}\nThe input is free-form text.")
    schema["properties"] = {}  # the caller owns its copy
    assert custom_tool_as_function(tool)[2] == SCHEMA


@pytest.mark.parametrize(
    "tool", [{"type": "custom"}, {"type": "custom", "name": ""}, {"type": "custom", "name": 3}]
)
def test_custom_tool_without_a_name_is_invalid(tool: dict[str, object]) -> None:
    with pytest.raises(InvalidInput) as caught:
        custom_tool_as_function(tool, param="tools[2]")
    assert caught.value.param == "tools[2].name"


# -- decoding: the rules -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        pytest.param('{"input":"ls -la"}', "ls -la", id="compact"),
        pytest.param(' \n{ "input" : "a\\nb" }\n', "a\nb", id="whitespace"),
        pytest.param('{"patch": "*** Begin Patch\\n"}', "*** Begin Patch\n", id="another-key"),
        pytest.param('{"in\\"put": "x"}', "x", id="escaped-key"),
        pytest.param('{"input": "x", "extra": 1}', "x", id="later-members-ignored"),
        pytest.param('{"text": "first", "input": "second"}', "first", id="first-member-wins"),
        pytest.param('{"input": "x"} trailing', "x", id="trailing-text-ignored"),
        pytest.param("*** Begin Patch\n*** End Patch", "*** Begin Patch\n*** End Patch", id="bare"),
        pytest.param("  SELECT 1", "  SELECT 1", id="bare-keeps-leading-space"),
        pytest.param('"quoted"', '"quoted"', id="top-level-string-is-bare"),
        pytest.param("{}", "{}", id="empty-object"),
        pytest.param('{"n": 1}', '{"n": 1}', id="non-string-value"),
        pytest.param('{"input": ["a"]}', '{"input": ["a"]}', id="array-value"),
        pytest.param("{ not json", "{ not json", id="brace-then-text"),
        pytest.param('{"input', '{"input', id="cut-before-value"),
        pytest.param('{"input": "abc', "abc", id="cut-inside-value"),
        pytest.param('{"input": "a\\', "a\\", id="cut-after-backslash"),
        pytest.param('{"input": "a\\u00', "a\\u00", id="cut-inside-unicode-escape"),
        pytest.param('{"input": "a\\qb"}', "a\\qb", id="unknown-escape-kept"),
        pytest.param('{"input": "a\\u12G4"}', "a\\u12G4", id="broken-unicode-escape-kept"),
        pytest.param('{"input": "\\ud83d\\ude00!"}', "\U0001f600!", id="surrogate-pair"),
        pytest.param('{"input": "\\ud83dx"}', "\ud83dx", id="lone-high-surrogate"),
        pytest.param('{"input": "\\ude00"}', "\ude00", id="lone-low-surrogate"),
        pytest.param('{"input": "\\ud83d\\u0041"}', "\ud83dA", id="high-then-non-surrogate"),
        pytest.param('{"input": "\\ud83d\\ud83d\\ude00"}', "\ud83d\U0001f600", id="high-high-low"),
        pytest.param('{"input": "\\ud83d\\n"}', "\ud83d\n", id="high-then-simple-escape"),
        pytest.param('{"input": "\\ud83d\\u12"}', "\ud83d\\u12", id="high-then-broken-escape"),
        pytest.param('{"input": "\\ud83d', "\ud83d", id="cut-after-high"),
        pytest.param('{"input": "\\ud83d\\', "\ud83d\\", id="cut-after-high-backslash"),
        pytest.param('{"input": "\\ud83d\\ude', "\ud83d\\ude", id="cut-inside-low"),
        pytest.param('{"input": "raw\nnewline"}', "raw\nnewline", id="raw-control-char"),
        pytest.param("", "", id="empty"),
        pytest.param("   ", "   ", id="only-whitespace"),
    ],
)
def test_decode_rules(arguments: str, expected: str) -> None:
    assert decode_custom_input(arguments) == expected


@pytest.mark.parametrize(
    "escape", ['\\"', "\\\\", "\\/", "\\b", "\\f", "\\n", "\\r", "\\t", "\\u00e9", "\\u2028"]
)
def test_every_json_escape_is_undone(escape: str) -> None:
    arguments = '{"input": "<' + escape + '>"}'
    assert decode_custom_input(arguments) == json.loads(arguments)["input"]


def test_encode_is_compact_json_that_keeps_non_ascii() -> None:
    assert encode_custom_input('é "q"\n') == '{"input":"é \\"q\\"\\n"}'
    assert json.loads(encode_custom_input("x")) == {INPUT_KEY: "x"}


# -- decoding: properties ------------------------------------------------------------------------

ANY_CHAR = st.characters(exclude_categories=())  # surrogates included
KEYS = st.one_of(st.just("input"), st.text(ANY_CHAR, max_size=8))
SEPARATORS = st.sampled_from([(",", ":"), (", ", ": "), (",", " : ")])


@st.composite
def json_arguments(draw: st.DrawFn) -> tuple[str, str]:
    """Valid single-member JSON arguments and the value they carry."""
    value = draw(st.text(ANY_CHAR))
    key = draw(KEYS)
    text = json.dumps({key: value}, ensure_ascii=draw(st.booleans()), separators=draw(SEPARATORS))
    pad = draw(st.sampled_from(["", " ", "\n", " \t\r\n"]))
    return pad + text + pad, value


@given(st.text(ANY_CHAR))
@example("\ud83d")
@example('line 1\nline "2" \\ \U0001f600 /')
def test_encode_then_decode_is_the_identity(text: str) -> None:
    assert decode_custom_input(encode_custom_input(text)) == text


@given(json_arguments())
def test_decode_matches_json_loads_on_valid_arguments(case: tuple[str, str]) -> None:
    arguments, value = case
    assert decode_custom_input(arguments) == value == next(iter(json.loads(arguments).values()))


@st.composite
def any_arguments(draw: st.DrawFn) -> str:
    """Valid arguments, their truncations, and arbitrary text that only looks like JSON in places."""
    kind = draw(st.sampled_from(["json", "truncated", "text", "brace"]))
    if kind in ("json", "truncated"):
        arguments, _ = draw(json_arguments())
        if kind == "truncated":
            arguments = arguments[: draw(st.integers(0, len(arguments)))]
        return arguments
    alphabet = st.one_of(ANY_CHAR, st.sampled_from(list('{}":\\u ,dDa0\n')))
    text = draw(st.text(alphabet))
    return "{" + text if kind == "brace" else text


@given(any_arguments(), st.lists(st.integers(0, 200), max_size=12))
def test_streamed_deltas_add_up_to_the_decoded_input(arguments: str, cuts: list[int]) -> None:
    chunks = _split(arguments, cuts)
    assert "".join(chunks) == arguments
    assert _stream(chunks) == decode_custom_input(arguments)


TRICKY = [
    encode_custom_input('a\nb "c" \\ / \t \U0001f600 é'),
    json.dumps(
        {"input": 'a\nb "c" \\ / \U0001f600 \ud83d \ude00'}
    ),  # \uXXXX escapes, pairs and lone
    '{"input": "x\\/y\\u00e9\\ud83d\\ude00\\ud83d\\u0041"}',
    json.dumps({"cmd": "ls\n\U0001f600"}, indent=1),
    '{"input": "cut \\ud83d\\ude',
    "*** Begin Patch\n*** End Patch\n",
    "  {x",
    '{"a": 1}',
]


@pytest.mark.parametrize("arguments", TRICKY)
def test_every_single_split_point(arguments: str) -> None:
    expected = decode_custom_input(arguments)
    for cut in range(len(arguments) + 1):
        assert _stream([arguments[:cut], arguments[cut:]]) == expected, cut
    assert _stream(list(arguments)) == expected  # one character at a time


@pytest.mark.parametrize("arguments", TRICKY[:3])
def test_every_pair_of_split_points(arguments: str) -> None:
    expected = decode_custom_input(arguments)
    n = len(arguments)
    for a in range(n + 1):
        for b in range(a, n + 1):
            assert _stream([arguments[:a], arguments[a:b], arguments[b:]]) == expected, (a, b)


def test_plain_text_is_streamed_as_soon_as_it_arrives() -> None:
    value = "print('hello world')"
    arguments = encode_custom_input(value)
    stream = CustomInputStream()
    opening = arguments.index(value)
    assert stream.feed(arguments[:opening]) == ""
    seen = ""
    for k, char in enumerate(value):
        seen += stream.feed(char)
        assert seen == value[: k + 1]
    assert stream.feed(arguments[opening + len(value) :]) == ""
    assert stream.finish() == ""


def test_a_surrogate_pair_is_held_until_its_second_half() -> None:
    stream = CustomInputStream()
    assert stream.feed('{"input":"\\ud83d') == ""
    assert stream.feed("\\ude") == ""
    assert stream.feed('00"}') == "\U0001f600"


def test_bare_text_is_streamed_once_it_is_known_not_to_be_json() -> None:
    stream = CustomInputStream()
    assert stream.feed("  ") == ""  # could still open an object
    assert stream.feed("*** Begin") == "  *** Begin"
    assert stream.feed(" Patch") == " Patch"
    assert stream.finish() == ""


def test_feed_after_finish_is_an_error() -> None:
    stream = CustomInputStream()
    stream.feed('{"input": "x"}')
    assert stream.finish() == ""
    with pytest.raises(ValueError, match="after finish"):
        stream.feed("more")
