"""No special token's text ever reaches a response: deltas, done values, recovered text,
reasoning, tool names, arguments and custom tool input (``domain.decoder``)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.encoding import load_encoding
from domain.builder import Usage
from domain.decoder import FIRST_SPECIAL, STRUCTURAL, HarmonyDecoder
from domain.events import Event
from domain.machine import check_log
from domain.projections import fold, payload
from tests.domain.factories import make_builder

ENC = load_encoding()
RESERVED = 200711
EOT = 199999
#: Ordinary tokens that cannot spell "<|" whatever their order: words, JSON punctuation, headers.
POOL = sorted(
    set(
        ENC.encode(
            'analysis final commentary assistant to=functions.get_weather json {"city": "Rome", '
            '"n": [1, 2]} Hello, world! The answer is 42. \u00e9t\u00e9 \u4e2d\u6587 \U0001f600'
        )
    )
)
SPECIAL_IDS = st.one_of(
    st.sampled_from(sorted(STRUCTURAL)),
    st.integers(min_value=FIRST_SPECIAL, max_value=201_087),  # every special id of o200k_harmony
    st.integers(min_value=201_088, max_value=201_200),  # a model vocabulary padded past Harmony's
)


def _decode(
    tokens: list[int], *, truncated: bool = False, custom: tuple[str, ...] = ()
) -> tuple[list[Event], object]:
    b = make_builder()
    b.created()
    b.in_progress()
    decoder = HarmonyDecoder(ENC, b, custom_tools=custom)
    for token in tokens:
        decoder.feed([token])
    result = decoder.finish(truncated=truncated)
    b.finish("incomplete" if truncated else "completed", usage=Usage(), completed_at=1)
    events = b.take()
    check_log(events)
    return events, result


def _texts(events: list[Event]) -> str:
    return "\n".join(json.dumps(payload(e), ensure_ascii=False) for e in events)


def _tokens(text: str) -> list[int]:
    return ENC.encode(text, allowed_special="all")


@pytest.mark.parametrize(
    "completion",
    [
        # inside content: final answer, reasoning, function arguments, custom tool input
        "<|channel|>final<|message|>Hel<|reserved_200711|>lo<|endoftext|> there<|return|>",
        "<|channel|>analysis<|message|>Think<|reserved_200711|>ing<|end|>"
        "<|start|>assistant<|channel|>final<|message|>ok<|return|>",
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":'
        '<|reserved_200711|>"Rome"}<|call|>',
        '<|channel|>commentary to=functions.sql <|constrain|>json<|message|>{"input":"SEL'
        '<|reserved_200711|>ECT 1"}<|call|>',
        # in a header: the function's name
        "<|channel|>commentary to=functions.get<|reserved_200711|>_weather <|constrain|>json"
        '<|message|>{"city":"Rome"}<|call|>',
        # between messages, and as malformed output recovered as text
        "<|channel|>final<|message|>one<|end|><|reserved_200711|><|endoftext|>"
        "<|start|>assistant<|channel|>final<|message|>two<|return|>",
        "stray <|reserved_200711|>words<|endoftext|> and more",
        "<|channel|>final <|reserved_200711|>never reaches the message<|return|>",
        # a special token between the bytes of one character
        "<|channel|>final<|message|>caf",
    ],
)
def test_special_tokens_never_reach_the_text(completion: str) -> None:
    tokens = _tokens(completion)
    if completion.endswith("caf"):
        e_acute = ENC.encode("\u00e9", disallowed_special=())
        tokens += (
            [*e_acute[:1], RESERVED, *e_acute[1:]] if len(e_acute) > 1 else [RESERVED, *e_acute]
        )
    events, result = _decode(tokens, custom=("sql",))
    text = _texts(events)
    assert "<|" not in text and "reserved" not in text and "endoftext" not in text, text
    assert result.dropped_special >= 1 and result.recovered  # type: ignore[attr-defined]
    response = fold(events)
    assert response["output"], "the text around the special tokens is kept"


def test_the_text_around_a_dropped_token_is_kept_whole() -> None:
    events, _ = _decode(_tokens("<|channel|>final<|message|>Hel<|reserved_200711|>lo<|return|>"))
    [item] = fold(events)["output"]
    assert item["content"][0]["text"] == "Hello"
    events, _ = _decode(
        _tokens(
            "<|channel|>commentary to=functions.get<|reserved_200711|>_weather <|constrain|>json"
            '<|message|>{"city":"Rome"}<|call|>'
        )
    )
    [call] = fold(events)["output"]
    assert (call["name"], call["arguments"]) == ("get_weather", '{"city":"Rome"}')


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(SPECIAL_IDS, st.sampled_from(POOL)), max_size=60),
    st.booleans(),
)
def test_random_token_sequences_never_put_a_special_token_in_text(
    tokens: list[int], truncated: bool
) -> None:
    events, _ = _decode(tokens, truncated=truncated, custom=("get_weather",))
    assert "<|" not in _texts(events)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.sampled_from(
                [
                    "<|channel|>final<|message|>",
                    "<|channel|>analysis<|message|>",
                    "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>",
                    "<|end|><|start|>assistant",
                    "<|return|>",
                    "<|call|>",
                    "Hello ",
                    '{"city": "Rome"}',
                ]
            ).map(_tokens),
            SPECIAL_IDS.map(lambda t: [t]),
        ),
        max_size=20,
    ),
)
def test_harmony_shaped_output_with_special_tokens_mixed_in(chunks: list[list[int]]) -> None:
    events, _ = _decode([t for chunk in chunks for t in chunk], custom=("get_weather",))
    assert "<|" not in _texts(events)
