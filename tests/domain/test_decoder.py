"""Output tokens -> events: the happy paths, and recovery from every malformed ending."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from openai_harmony import Role, StreamableParser

from app.encoding import load_encoding
from domain.builder import ResponseBuilder, Usage
from domain.decoder import _AS_ASSISTANT, CALL, END, RETURN, HarmonyDecoder, strip_harmony_markup
from domain.events import Event, OutputTextDelta
from domain.machine import check_log
from domain.parsers import Parser, ParserPool
from domain.projections import fold
from tests.domain.factories import make_builder

ENC = load_encoding()


def decode(
    completion: str | list[int],
    *,
    truncated: bool = False,
    custom: tuple[str, ...] = (),
    prefill: str = "",
    builder: ResponseBuilder | None = None,
) -> tuple[dict[str, Any], list[Event], Any]:
    b = builder or make_builder()
    b.created()
    b.in_progress()
    tokens = (
        completion
        if isinstance(completion, list)
        else ENC.encode(completion, allowed_special="all")
    )
    pre = ENC.encode(prefill, allowed_special="all") if prefill else []
    decoder = HarmonyDecoder(ENC, b, custom_tools=custom, prefill=pre)
    for token in tokens:  # one token at a time, as an engine streams them
        decoder.feed([token])
    result = decoder.finish(truncated=truncated)
    b.finish("incomplete" if truncated else "completed", usage=Usage(), completed_at=1)
    events = b.take()
    check_log(events)
    return fold(events), events, result


def _summary(response: dict[str, Any]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for item in response["output"]:
        if item["type"] == "message":
            out.append(
                (
                    "message",
                    item["phase"],
                    "".join(p["text"] for p in item["content"]),
                    item["status"],
                )
            )
        elif item["type"] == "reasoning":
            out.append(("reasoning", "".join(p["text"] for p in item["content"]), item["status"]))
        elif item["type"] == "function_call":
            out.append(("function_call", item["name"], item["arguments"], item["status"]))
        else:
            out.append(("custom_tool_call", item["name"], item["input"]))
    return out


def test_reasoning_then_final_answer() -> None:
    response, events, result = decode(
        "<|channel|>analysis<|message|>Think about it.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Hello, world!<|return|>"
    )
    assert _summary(response) == [
        ("reasoning", "Think about it.", "completed"),
        ("message", "final_answer", "Hello, world!", "completed"),
    ]
    assert not result.recovered
    assert response["output"][-1]["phase"] == "final_answer"
    assert result.reasoning_tokens > 0 and result.output_tokens == len(
        ENC.encode(
            "<|channel|>analysis<|message|>Think about it.<|end|>"
            "<|start|>assistant<|channel|>final<|message|>Hello, world!<|return|>",
            allowed_special="all",
        )
    )
    deltas = [e.delta for e in events if isinstance(e, OutputTextDelta)]
    assert len(deltas) > 1 and "".join(deltas) == "Hello, world!"


def test_preamble_then_tool_call_keeps_dotted_names() -> None:
    response, _, _ = decode(
        "<|channel|>commentary<|message|>Let me check.<|end|>"
        '<|start|>assistant<|channel|>commentary to=functions.weather.get_current <|constrain|>json<|message|>{"city":"Paris"}<|call|>'
    )
    assert _summary(response) == [
        ("message", "commentary", "Let me check.", "completed"),
        ("function_call", "weather.get_current", '{"city":"Paris"}', "completed"),
    ]
    assert response["output"][-1]["type"] == "function_call"  # the turn ended in a call


def test_recipient_before_the_channel_and_on_the_analysis_channel() -> None:
    response, _, _ = decode(
        ' to=functions.lookup<|channel|>analysis <|constrain|>json<|message|>{"q":1}<|call|>'
    )
    assert _summary(response) == [("function_call", "lookup", '{"q":1}', "completed")]


def test_custom_tool_call_streams_the_decoded_input() -> None:
    response, events, _ = decode(
        '<|channel|>commentary to=functions.apply_patch <|constrain|>json<|message|>{"input":"line 1\\nline \\"2\\" \\ud83d\\ude00"}<|call|>',
        custom=("apply_patch",),
    )
    assert _summary(response) == [
        ("custom_tool_call", "apply_patch", 'line 1\nline "2" \U0001f600')
    ]
    deltas = "".join(
        getattr(e, "delta", "") for e in events if e.type == "response.custom_tool_call_input.delta"
    )
    assert deltas == 'line 1\nline "2" \U0001f600'


def test_named_tool_choice_prefill_opens_the_call_at_once() -> None:
    response, _, _ = decode(
        '{"x": 1}<|call|>',
        prefill="<|channel|>commentary to=functions.pick <|constrain|>json<|message|>",
    )
    assert _summary(response) == [("function_call", "pick", '{"x": 1}', "completed")]


def test_two_parallel_calls_in_one_turn() -> None:
    response, _, _ = decode(
        "<|channel|>commentary to=functions.a <|constrain|>json<|message|>{}<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.b <|constrain|>json<|message|>{}<|call|>"
    )
    assert [s[:2] for s in _summary(response)] == [("function_call", "a"), ("function_call", "b")]


# -- malformed output (the seed-000 cases) ---------------------------------------------------


def test_header_without_message_token_then_return_recovers_the_text() -> None:
    response, _, result = decode('<|channel|>final {"answer": "hi"}<|return|>')
    assert _summary(response) == [("message", "final_answer", '{"answer": "hi"}', "completed")]
    assert result.recovered


def test_analysis_without_a_start_is_parsed_not_lost() -> None:
    response, _, _ = decode("<|channel|>analysis<|message|>thinking<|end|>")
    assert _summary(response) == [("reasoning", "thinking", "completed")]


def test_stray_text_after_a_message_is_recovered_as_a_final_answer() -> None:
    response, _, result = decode("<|channel|>analysis<|message|>thinking<|end|>Hello world")
    assert _summary(response) == [
        ("reasoning", "thinking", "completed"),
        ("message", "final_answer", "Hello world", "completed"),
    ]
    assert result.recovered and any("outside any message" in n for n in result.notes)


def test_stray_run_ends_at_the_next_start_and_parsing_resumes() -> None:
    response, _, _ = decode(
        "<|channel|>analysis<|message|>a<|end|> oops <|start|>assistant<|channel|>final<|message|>ok<|return|>"
    )
    assert _summary(response) == [
        ("reasoning", "a", "completed"),
        ("message", "final_answer", "oops", "completed"),
        ("message", "final_answer", "ok", "completed"),
    ]


def test_eos_inside_a_header_recovers_without_markers() -> None:
    response, _, result = decode(
        "<|channel|>final to=functions.x <|constrain|>json", truncated=True
    )
    assert result.recovered
    for item in response["output"]:
        for part in item.get("content", []):
            assert "<|" not in part["text"]


@pytest.mark.parametrize(
    "completion",
    [
        "<|channel|>analysis<|message|>Let me think about this carefully",
        "<|channel|>analysis<|message|>ok<|end|><|start|>assistant<|channel|>final<|message|>The answer is",
        '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": ',
    ],
)
def test_truncation_in_content_keeps_the_text_and_marks_the_item_incomplete(
    completion: str,
) -> None:
    response, _, _ = decode(completion, truncated=True)
    last = response["output"][-1]
    assert last["status"] == "incomplete"
    text = "".join(p["text"] for p in last.get("content", [])) or last.get("arguments", "")
    assert text and completion.endswith(text)


def test_truncation_at_every_token_never_raises_and_never_leaks_markers() -> None:
    completion = (
        "<|channel|>analysis<|message|>Plan.<|end|><|start|>assistant<|channel|>commentary to=functions.f "
        '<|constrain|>json<|message|>{"k": "v"}<|call|>'
    )
    tokens = ENC.encode(completion, allowed_special="all")
    for cut in range(len(tokens) + 1):
        response, _, _ = decode(tokens[:cut], truncated=cut < len(tokens))
        for item in response["output"]:
            for part in item.get("content", []):
                assert "<|" not in part["text"], (cut, part)


def test_strip_harmony_markup() -> None:
    assert strip_harmony_markup('<|channel|>final {"answer": "hi"}') == '{"answer": "hi"}'
    assert strip_harmony_markup("<|start|>assistant<|channel|>final<|message|>Hi<|return|>") == "Hi"
    assert strip_harmony_markup(" to=functions.x<|channel|>commentary json<|message|>{}") == "{}"
    assert strip_harmony_markup("plain text") == "plain text"


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.sampled_from([200002, 200003, 200005, 200006, 200007, 200008, 200012]),
            st.integers(min_value=0, max_value=199_997),
        ),
        max_size=40,
    ),
    st.booleans(),
)
def test_random_token_sequences_never_raise(tokens: list[int], truncated: bool) -> None:
    response, _, _ = decode(tokens, truncated=truncated)
    for item in response["output"]:
        for part in item.get("content", []):
            assert "<|" not in part["text"]


def test_a_function_declared_in_a_namespace_comes_back_with_its_name_and_namespace() -> None:
    b = make_builder()
    b.created()
    decoder = HarmonyDecoder(
        ENC, b, function_names={"mcp__docs__search": ("search", "mcp__docs__")}
    )
    decoder.feed(
        ENC.encode(
            '<|channel|>commentary to=functions.mcp__docs__search <|constrain|>json<|message|>{"q":"x"}<|call|>',
            allowed_special="all",
        )
    )
    decoder.finish(truncated=False)
    b.finish("completed", usage=Usage(), completed_at=1)
    item = fold(b.take())["output"][0]
    assert (item["name"], item["namespace"], item["arguments"]) == (
        "search",
        "mcp__docs__",
        '{"q":"x"}',
    )


def test_required_prefill_lets_the_model_name_the_tool() -> None:
    response, _, result = decode(
        'get_weather <|constrain|>json<|message|>{"city":"Rome"}<|call|>',
        prefill="<|channel|>commentary to=functions.",
    )
    assert _summary(response) == [("function_call", "get_weather", '{"city":"Rome"}', "completed")]
    assert result.calls == 1


def test_an_incomplete_forced_header_is_not_a_call() -> None:
    response, _, result = decode(
        "<|channel|>final<|message|>No call.<|return|>",
        prefill="<|channel|>commentary to=functions.",
    )
    assert result.calls == 0
    assert [s[0] for s in _summary(response)] == ["message"]


def test_a_nul_character_in_model_output_is_stored_as_a_replacement_character() -> None:
    b = make_builder()
    b.created()
    b.open_message()
    b.append("a\x00b")
    b.finish("completed", usage=Usage(), completed_at=1)
    assert fold(b.take())["output"][0]["content"][0]["text"] == "a\ufffdb"


class _ParserOnly(HarmonyDecoder):
    """The decoder as it was before it put off making its parser and content tokens skipped it:
    a new parser for each decode and after malformed output, and every token goes to it."""

    def _deferred(self, base: int) -> Any:
        role = Role.ASSISTANT if base == _AS_ASSISTANT else None
        return StreamableParser(self._encoding, role)._inner

    def _start_content(self) -> None:
        super()._start_content()
        self._fast = False


def _events_of(
    decoder_class: type[HarmonyDecoder],
    tokens: list[int],
    truncated: bool,
    parsers: ParserPool | None = None,
) -> list[Event]:
    b = make_builder()  # (its ids count from the same start each time)
    b.created()
    b.in_progress()
    decoder = decoder_class(ENC, b, custom_tools=("patch",), parsers=parsers)
    for token in tokens:
        decoder.feed([token])
    decoder.finish(truncated=truncated)
    return b.take()


#: Content tokens that are not whole UTF-8 on their own: halves of characters, lone bytes.
_SPLIT = [t for t in ENC.encode("🎉 日本語 é ü 🦀 ∑ ok", allowed_special="all")] + [
    231,
    71344,
    139786,
]
_HEADERS = [
    ENC.encode(text, allowed_special="all")
    for text in (
        "<|channel|>final<|message|>",
        "<|channel|>analysis<|message|>",
        "<|channel|>commentary<|message|>",
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>",
        "<|channel|>commentary to=functions.patch<|message|>",
        "<|start|>assistant<|channel|>final<|message|>",
    )
]


#: Random completions: headers, structural tokens, split characters, ordinary tokens, in runs.
_RUNS = st.lists(
    st.one_of(
        st.sampled_from(_HEADERS),
        st.lists(
            st.one_of(
                st.sampled_from([200002, 200003, 200005, 200006, 200007, 200008, 200012]),
                st.sampled_from(_SPLIT),
                st.integers(min_value=0, max_value=199_997),
                st.sampled_from(ENC.encode(' {"city": "Rome"} <|x|> ', allowed_special="all")),
            ),
            max_size=12,
        ),
    ),
    max_size=8,
)


@settings(max_examples=300, deadline=None)
@given(_RUNS, st.booleans())
def test_content_tokens_that_skip_the_parser_make_the_events_the_parser_makes(
    runs: list[list[int]], truncated: bool
) -> None:
    tokens = [token for run in runs for token in run]
    assert _events_of(HarmonyDecoder, tokens, truncated) == _events_of(
        _ParserOnly, tokens, truncated
    )


#: A completion read to its end: its parser goes back to the pool.
_WHOLE = st.builds(
    lambda header, words, end: [*header, *words, end],
    st.sampled_from(_HEADERS),
    st.lists(
        st.one_of(st.integers(min_value=0, max_value=199_997), st.sampled_from(_SPLIT)), max_size=12
    ),
    st.sampled_from([END, RETURN, CALL]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_WHOLE, min_size=1, max_size=3), _RUNS, st.booleans())
# <|start|> inside a header after <|channel|>!: a parser made for the assistant role read it as
# the recipient's text, a pooled one refused the header (found in CI, 2026-12-05)
@example(
    before=[[200005, 17196, 200008, 200007]],
    runs=[[200005, 0], [200006, 173781, 200005, 17196, 200008]],
    truncated=False,
)
def test_a_parser_from_the_pool_makes_the_events_a_new_one_makes(
    before: list[list[int]], runs: list[list[int]], truncated: bool
) -> None:
    pool = ParserPool(ENC)
    for completion in before:  # each decode takes the parser the one before gave back
        _events_of(HarmonyDecoder, completion, False, pool)
    assert len(pool) >= 1  # (one that began with <|start|> made its own parser)
    tokens = [token for run in runs for token in run]
    reused = _events_of(HarmonyDecoder, tokens, truncated, pool)
    assert reused == _events_of(HarmonyDecoder, tokens, truncated, ParserPool(ENC, size=0))
    assert reused == _events_of(_ParserOnly, tokens, truncated)


def test_a_response_whose_headers_are_known_and_whose_text_is_whole_makes_no_parser() -> None:
    pool = ParserPool(ENC)
    answer = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hi!<|return|>"
    tokens = ENC.encode(answer, allowed_special="all")
    first = _events_of(HarmonyDecoder, tokens, False, pool)
    assert (
        pool.made == 1 and len(pool) == 1
    )  # the headers were new: read by a parser, which went back
    for _ in range(3):
        assert _events_of(HarmonyDecoder, tokens, False, pool) == first
    assert pool.made == 1 and len(pool) == 1  # known: no parser taken, none made
    split = ENC.encode("<|channel|>final<|message|>🎉<|return|>", allowed_special="all")
    _events_of(
        HarmonyDecoder, split, False, pool
    )  # a split character needs the parser: the pooled one
    assert pool.made == 1 and len(pool) == 1


def test_the_pool_keeps_a_parser_only_if_it_waits_for_start_has_read_less_than_its_cap_and_has_room() -> (
    None
):
    channel = ENC.encode("<|channel|>", allowed_special="all")[0]
    pool = ParserPool(ENC, size=1, token_cap=10)
    parser = pool.assistant(channel)
    assert pool.made == 1
    for token in ENC.encode("<|channel|>final<|message|>Hi", allowed_special="all"):
        parser.inner.process(token)
    assert pool.give_back(parser) is False and len(pool) == 0  # inside a message
    parser.inner.process(RETURN)
    parser.read = 9
    assert pool.give_back(parser) is True and len(pool) == 1
    other = pool.expecting_start()
    assert other is parser and pool.made == 1
    again = pool.assistant(channel)  # the pool is empty: a new one
    assert pool.made == 2
    for p in (parser, again):
        p.inner.process(200006)  # <|start|>: no longer waiting for it
    parser.read, again.read = 10, 0
    for p in (parser, again):
        p.inner.process(173781)  # "assistant"
        for token in ENC.encode("<|channel|>final<|message|>x<|end|>", allowed_special="all"):
            p.inner.process(token)
    assert pool.give_back(parser) is True and len(pool) == 0  # read its cap
    assert pool.give_back(again) is True and len(pool) == 1
    assert pool.give_back(pool.assistant(0)) is False  # a new one, in a header
    assert len(pool) == 1


def test_a_finished_decoder_does_not_touch_the_parser_it_gave_back() -> None:
    pool = ParserPool(ENC)
    b = make_builder()
    b.created()
    decoder = HarmonyDecoder(ENC, b, parsers=pool)
    decoder.feed(ENC.encode("<|channel|>final<|message|>Hi<|return|>", allowed_special="all"))
    decoder.finish(truncated=False)
    assert len(pool) == 1
    with pytest.raises(RuntimeError, match="finished"):
        decoder.feed([200005])


def test_a_character_split_across_tokens_is_decoded_by_the_parser_from_there_on() -> None:
    text = "ok 🎉 and 日本語 then more"
    response, events, _ = decode(f"<|channel|>final<|message|>{text}<|return|>")
    assert _summary(response) == [("message", "final_answer", text, "completed")]
    assert "".join(e.delta for e in events if isinstance(e, OutputTextDelta)) == text


#: Two messages, each with a character split across tokens (their text needs the parser).
_TWO_MESSAGES = ENC.encode(
    "<|channel|>analysis<|message|>é then 🎉<|end|>"
    "<|start|>assistant<|channel|>final<|message|>ü and 🦀<|return|>",
    allowed_special="all",
)


class _KeepsNone(ParserPool):
    """A pool that finds no parser waiting for ``<|start|>``: decoders keep the parser they have."""

    def give_back(self, parser: Parser) -> bool:
        return False


def test_a_parser_the_pool_does_not_take_back_stays_with_its_decoder() -> None:
    pool = _KeepsNone(ENC)
    assert _events_of(HarmonyDecoder, _TWO_MESSAGES, False, pool) == _events_of(
        _ParserOnly, _TWO_MESSAGES, False
    )
    assert pool.made == 1  # one parser for both messages


def test_a_pooled_parser_counts_the_tokens_it_read_once() -> None:
    pool = ParserPool(ENC)
    _events_of(
        HarmonyDecoder, _TWO_MESSAGES, False, pool
    )  # new headers and split characters: one parser
    assert pool.made == 1 and len(pool) == 1
    assert pool.expecting_start().read == len(_TWO_MESSAGES)  # given back at each message's end
