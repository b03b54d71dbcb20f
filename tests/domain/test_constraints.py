"""The turn grammar (``domain.constraints``) and the ``# Response Formats`` section, checked with
llguidance itself: which Harmony turns it accepts, which it refuses."""

from __future__ import annotations

import functools
import json
import tempfile
from typing import Any

import pytest

from app.encoding import load_encoding
from app.harmony_tokenizer import write_tokenizer_files
from domain.constraints import regex_terminal, turn_grammar
from domain.prompt import PromptRequest, RenderedPrompt, render_prompt, response_formats_section

llguidance = pytest.importorskip("llguidance")
ENC = load_encoding()
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "units": {"enum": ["c", "f"]}},
    "required": ["city", "units"],
    "additionalProperties": False,
}


def _rendered(**fields: Any) -> RenderedPrompt:
    return render_prompt(ENC, PromptRequest(items="hi", **fields))


def _grammar(fmt: Any = None, **fields: Any) -> str | None:
    rendered = _rendered(**fields)
    turn = turn_grammar(fmt, rendered.tools, rendered.tool_choice, rendered.prefill)
    return None if turn is None else turn.grammar


def _accepts(grammar: str, text: str) -> bool:
    """Whether the grammar accepts ``text`` (Harmony markup and all) as a whole turn."""
    from llguidance import LLMatcher

    hf, ll = _tokenizers()
    matcher = LLMatcher(ll, LLMatcher.grammar_from_lark(grammar), log_level=0)
    assert not matcher.get_error(), matcher.get_error()
    ids = hf.encode(text, add_special_tokens=False)
    return bool(matcher.consume_tokens(ids)) and matcher.is_stopped()


@functools.cache
def _tokenizers() -> tuple[Any, Any]:
    from llguidance.hf import from_tokenizer
    from transformers import AutoTokenizer

    directory = write_tokenizer_files(tempfile.mkdtemp())
    hf = AutoTokenizer.from_pretrained(str(directory))
    return hf, from_tokenizer(hf, 201088)


FUNCTION = {"type": "function", "name": "get_weather", "parameters": SCHEMA}
LOOSE = {"type": "function", "name": "log", "parameters": {"type": "object"}, "strict": False}
SQL = {
    "type": "custom",
    "name": "sql",
    "format": {"type": "grammar", "syntax": "regex", "definition": "^SELECT [a-z]+$"},
}


def test_nothing_constrained_is_no_grammar() -> None:
    assert _grammar(None) is None
    assert _grammar({"type": "text"}, tools=[LOOSE]) is None


def test_json_schema_final_after_free_reasoning() -> None:
    grammar = _grammar({"type": "json_schema", "name": "w", "schema": SCHEMA})
    assert grammar is not None
    ok = '<|channel|>final<|message|>{"city":"Paris","units":"c"}<|return|>'
    assert _accepts(grammar, ok)
    reasoning = "<|channel|>analysis<|message|>Any text {not json} at all.<|end|><|start|>assistant"
    assert _accepts(grammar, reasoning + ok)
    assert not _accepts(
        grammar, '<|channel|>final<|message|>{"city":"Paris"}<|return|>'
    )  # required
    assert not _accepts(
        grammar, '<|channel|>final<|message|>{"city":"Paris","units":"k"}<|return|>'
    )
    assert not _accepts(grammar, "<|channel|>final<|message|>Paris<|return|>")


def test_strict_tool_arguments_and_free_loose_ones() -> None:
    grammar = _grammar(None, tools=[FUNCTION, LOOSE])
    assert grammar is not None
    call = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{}<|call|>"
    assert not _accepts(grammar, call.replace("{}", '{"town":5}'))
    assert _accepts(grammar, call.replace("{}", '{"city":"Oslo","units":"f"}'))
    assert _accepts(
        grammar,
        "<|channel|>commentary to=functions.log <|constrain|>json<|message|>anything<|call|>",
    )
    assert _accepts(
        grammar, "<|channel|>final<|message|>free answer<|return|>"
    )  # text.format is text
    assert not _accepts(
        grammar, "<|channel|>commentary to=functions.nope <|constrain|>json<|message|>{}<|call|>"
    )


def test_regex_custom_tool_payload_is_raw() -> None:
    grammar = _grammar(None, tools=[SQL])
    assert grammar is not None
    assert _accepts(
        grammar, "<|channel|>commentary to=functions.sql<|message|>SELECT users<|call|>"
    )
    assert not _accepts(
        grammar, "<|channel|>commentary to=functions.sql<|message|>DROP TABLE users<|call|>"
    )


def test_tool_choice_modes() -> None:
    required = _grammar(None, tools=[FUNCTION, SQL], tool_choice="required")
    assert required is not None  # the prompt ends with "to=functions."
    assert _accepts(required, "sql<|message|>SELECT x<|call|>")
    assert not _accepts(required, 'get_weather <|constrain|>json<|message|>{"city":"a"}<|call|>')
    named = _grammar(
        None, tools=[FUNCTION, SQL], tool_choice={"type": "function", "name": "get_weather"}
    )
    assert named is not None  # the prompt ends inside the call's message
    assert _accepts(named, '{"city":"a","units":"c"}<|call|>')
    none = _grammar({"type": "json_object"}, tools=[FUNCTION], tool_choice="none")
    assert none is not None and "functions" not in none
    assert _accepts(none, '<|channel|>final<|message|>{"any":[1,2]}<|return|>')
    assert not _accepts(
        none, '<|channel|>final<|message|>{"any": 1}<|return|>'
    )  # compact JSON only
    assert not _accepts(none, "<|channel|>final<|message|>[1]<|return|>")


def test_regex_terminal() -> None:
    assert regex_terminal("^a/b$") == "/a\\/b/"
    assert regex_terminal(r"cost \$") == r"/cost \$/"


def test_response_formats_section_reaches_the_developer_message() -> None:
    fmt = {
        "type": "json_schema",
        "name": "weather",
        "description": "The forecast.",
        "schema": SCHEMA,
    }
    section = response_formats_section(fmt)
    assert section == (
        "# Response Formats\n\n## weather\n\n// The forecast.\n"
        + json.dumps(SCHEMA, separators=(",", ":"))
    )
    prompt = ENC.decode_utf8(_rendered(response_format=fmt).token_ids)
    assert (
        "<|start|>developer<|message|># Instructions\n\n# Response Formats\n\n## weather" in prompt
    )
    assert response_formats_section({"type": "text"}) is None
