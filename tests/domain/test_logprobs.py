"""Log probabilities through the decoder and builder: which delta carries which token's entry,
the .done and part totals, the stored form, and a takeover's replay."""

from __future__ import annotations

import math
from typing import Any

from app.encoding import load_encoding
from app.logprobs import token_texts
from domain.builder import Usage
from domain.continuation import replay
from domain.decoder import HarmonyDecoder
from domain.events import Event, OutputTextDelta, OutputTextDone, ReasoningTextDelta
from domain.logprobs import FLOOR, TokenTexts
from domain.machine import check_log
from domain.projections import fold, from_wire, payload
from tests.domain.factories import make_builder

ENC = load_encoding()
TEXTS = token_texts(ENC)
_DECODE_BYTES = ENC._inner.decode_bytes


def _tokens(text: str) -> list[int]:
    return ENC.encode(text, allowed_special="all")


def _single_byte_token(value: int) -> int:
    """The o200k id whose bytes are exactly ``bytes([value])``."""
    for token in range(256 * 4):
        if bytes(_DECODE_BYTES([token])) == bytes([value]):
            return token
    raise AssertionError(f"no single-byte token for {value:#x}")


def _fake_logprobs(tokens: list[int]) -> list[tuple[float, list[tuple[int, float]]]]:
    """Per token: logprob -(i+1)/10 for the sampled one, a top-2 of (it, token 0)."""
    return [(-(i + 1) / 10, [(t, -(i + 1) / 10), (0, -5.0)]) for i, t in enumerate(tokens)]


def _decode(
    tokens: list[int], *, chunk: int = 1, builder: Any = None
) -> tuple[dict[str, Any], list[Event]]:
    b = builder or make_builder()
    b.created()
    b.in_progress()
    decoder = HarmonyDecoder(ENC, b, logprobs=TEXTS)
    lps = _fake_logprobs(tokens)
    for start in range(0, len(tokens), chunk):
        decoder.feed_logprobs(tokens[start : start + chunk], lps[start : start + chunk])
    decoder.finish(truncated=False)
    b.finish("completed", usage=Usage(), completed_at=1)
    events = b.take()
    check_log(events)
    return fold(events), events


def test_each_text_token_rides_on_its_delta_and_the_done_and_part_carry_them_all() -> None:
    reasoning = "<|channel|>analysis<|message|>think<|end|><|start|>assistant"
    head = _tokens(reasoning + "<|channel|>final<|message|>")
    body = _tokens("Hello world, fine.")
    response, events = _decode([*head, *body, *_tokens("<|return|>")])
    deltas = [e for e in events if isinstance(e, OutputTextDelta)]
    assert len(deltas) == len(body)  # one token per delta here
    for delta, token in zip(deltas, body, strict=True):
        (entry,) = delta.logprobs
        assert entry["bytes"] == list(_DECODE_BYTES([token]))
        assert entry["token"] == delta.delta
        assert [t["logprob"] for t in entry["top_logprobs"]] == [entry["logprob"], -5.0]
    assert all(not hasattr(e, "logprobs") for e in events if isinstance(e, ReasoningTextDelta))
    done = next(e for e in events if isinstance(e, OutputTextDone))
    every = [entry for d in deltas for entry in d.logprobs]
    assert list(done.logprobs) == every
    message = response["output"][1]
    assert message["content"][0]["logprobs"] == every
    assert "logprobs" not in response["output"][0]["content"][0]  # reasoning_text has none
    assert bytes(b for entry in every for b in entry["bytes"]).decode() == done.text


def test_a_character_split_across_tokens_rides_on_the_delta_that_completes_it() -> None:
    euro = [_single_byte_token(b) for b in "€".encode()]
    head = _tokens("<|channel|>final<|message|>")
    body = [*_tokens("a"), *euro, *_tokens("b")]
    response, events = _decode([*head, *body, *_tokens("<|return|>")])
    deltas = [e for e in events if isinstance(e, OutputTextDelta)]
    assert [d.delta for d in deltas] == ["a", "€", "b"]
    assert [len(d.logprobs) for d in deltas] == [1, 3, 1]
    assert [e["token"] for e in deltas[1].logprobs] == ["\ufffd"] * 3  # parts of a character
    part = response["output"][0]["content"][0]
    assert bytes(b for entry in part["logprobs"] for b in entry["bytes"]) == "a€b".encode()


def test_several_tokens_per_chunk_and_an_unfinished_character_at_the_end() -> None:
    head = _tokens("<|channel|>final<|message|>")
    lead = _single_byte_token("€".encode()[0])
    body = [*_tokens("one two"), lead]  # the message ends inside a character
    response, events = _decode([*head, *body, *_tokens("<|end|>")], chunk=3)
    part = response["output"][0]["content"][0]
    assert part["text"] == "one two"
    assert len(part["logprobs"]) == len(body) - 1  # the unfinished character made no text
    done = next(e for e in events if isinstance(e, OutputTextDone))
    assert list(done.logprobs) == part["logprobs"]


def test_stored_form_round_trips_and_the_sse_payload_is_openai_shaped() -> None:
    from openai.types.responses import ResponseTextDeltaEvent, ResponseTextDoneEvent

    head = _tokens("<|channel|>final<|message|>")
    _, events = _decode([*head, *_tokens("Hi there"), *_tokens("<|return|>")])
    for event in events:
        data = payload(event)
        assert from_wire(event.type, event.sequence_number, data) == event
        wire = {"type": event.type, "sequence_number": event.sequence_number, **data}
        if isinstance(event, OutputTextDelta):
            assert ResponseTextDeltaEvent.model_validate(wire).logprobs[0].top_logprobs
        if isinstance(event, OutputTextDone):
            assert len(ResponseTextDoneEvent.model_validate(wire).logprobs) == 2


def test_not_finite_logprobs_are_written_as_openai_floor() -> None:
    texts = TokenTexts(_DECODE_BYTES)
    entry = texts.entry(_tokens("x")[0], -math.inf, [(0, math.nan)])
    assert entry["logprob"] == FLOOR and entry["top_logprobs"][0]["logprob"] == FLOOR
    assert texts.entry(0, -0.5, [])["top_logprobs"] == []


def test_without_logprobs_parts_keep_an_empty_list() -> None:
    b = make_builder()
    b.created()
    b.in_progress()
    decoder = HarmonyDecoder(ENC, b)
    decoder.feed(_tokens("<|channel|>final<|message|>Plain text<|return|>"))
    decoder.finish(truncated=False)
    b.finish("completed", usage=Usage(), completed_at=1)
    events = b.take()
    assert all(e.logprobs == () for e in events if isinstance(e, OutputTextDelta | OutputTextDone))
    assert fold(events)["output"][0]["content"][0]["logprobs"] == []


def test_a_replayed_log_keeps_the_logprobs_its_deltas_carried() -> None:
    tokens = _tokens("<|channel|>final<|message|>Partly written")
    b = make_builder()
    b.created()
    b.in_progress()
    decoder = HarmonyDecoder(ENC, b, logprobs=TEXTS)
    decoder.feed_logprobs(tokens, _fake_logprobs(tokens))
    logged = b.take()
    logged_entries = [
        entry for e in logged if isinstance(e, OutputTextDelta) for entry in e.logprobs
    ]
    assert logged_entries
    again = replay(
        logged,
        [tokens],
        new_decoder=lambda builder: HarmonyDecoder(ENC, builder, logprobs=TEXTS),
        new_id=lambda prefix: f"{prefix}_new",
    )
    more = _tokens(" and finished")
    again.decoder.feed_logprobs(more, _fake_logprobs(more))
    again.decoder.finish(truncated=False)
    again.builder.finish("completed", usage=Usage(), completed_at=1)
    tail = again.builder.take()
    done = next(e for e in tail if isinstance(e, OutputTextDone))
    assert done.text == "Partly written and finished"
    assert len(done.logprobs) == len(tokens) - 3 + len(more)  # every text token, header excluded
    assert list(done.logprobs[: len(logged_entries)]) == logged_entries
    check_log([*logged, *again.pending, *tail])
