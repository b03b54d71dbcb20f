"""Replaying a log to continue it (``domain.continuation``): append by append, as its writer's
coalescing builder made it, or one delta a token, as writers made logs before they coalesced."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from app.encoding import load_encoding
from domain.builder import ResponseBuilder, Usage
from domain.continuation import CannotReplay, replay
from domain.decoder import HarmonyDecoder
from domain.events import Event, OutputTextDelta, ReasoningTextDelta
from domain.machine import check_log
from domain.projections import fold
from tests.domain.factories import counter_ids, response_skeleton

ENC = load_encoding()
TEXT = (
    "<|channel|>analysis<|message|>Weighing it up slowly.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>The answer is forty two, said the machine.<|return|>"
)
TOKENS = ENC.encode(TEXT, allowed_special="all")
CUT = len(TOKENS) - 5  # the log ends inside the final message


def logged(writes: Sequence[Sequence[int]], *, coalesce: bool) -> list[Event]:
    """The log a writer made, taking the events after each append's tokens."""
    builder = ResponseBuilder(response_skeleton(), new_id=counter_ids(), coalesce=coalesce)
    builder.created()
    builder.in_progress()
    decoder = HarmonyDecoder(ENC, builder)
    events = builder.take()
    for write in writes:
        decoder.feed(write)
        events += builder.take()
    return events


def split(tokens: Sequence[int], sizes: Sequence[int]) -> list[list[int]]:
    writes, at = [], 0
    for size in sizes:
        writes.append(list(tokens[at : at + size]))
        at += size
    writes.append(list(tokens[at:]))
    return [w for w in writes if w]


def continued(events: list[Event], writes: list[list[int]], coalesce: bool) -> list[Event]:
    again = replay(
        events,
        writes,
        new_decoder=lambda b: HarmonyDecoder(ENC, b),
        new_id=lambda prefix: f"{prefix}_new",
        coalesce=coalesce,
    )
    assert again.builder.coalesce is coalesce  # it goes on as this server writes
    again.decoder.feed(TOKENS[CUT:])
    again.decoder.finish(truncated=False)
    again.builder.finish("completed", usage=Usage(), completed_at=1)
    return [*events, *again.pending, *again.builder.take()]


def deltas(events: list[Event]) -> int:
    return sum(isinstance(e, OutputTextDelta | ReasoningTextDelta) for e in events)


@pytest.mark.parametrize("server", [True, False], ids=["server-coalesces", "server-does-not"])
@pytest.mark.parametrize("coalesce", [True, False], ids=["log-coalesced", "log-a-delta-a-token"])
def test_a_log_replays_append_by_append_and_goes_on_as_if_never_cut(
    coalesce: bool, server: bool
) -> None:
    writes = split(TOKENS[:CUT], [3, 1, 4, 2, 7, 1, 5])
    events = logged(writes, coalesce=coalesce)
    uncut = logged([TOKENS], coalesce=False)
    full = continued(events, writes, server)
    check_log(full)
    assert [e.sequence_number for e in full] == list(range(len(full)))
    whole = ResponseBuilder(response_skeleton(), new_id=counter_ids())
    whole.created()
    whole.in_progress()
    decoder = HarmonyDecoder(ENC, whole)
    decoder.feed(TOKENS)
    decoder.finish(truncated=False)
    whole.finish("completed", usage=Usage(), completed_at=1)
    expected = fold(whole.take())
    got = fold(full)
    assert [o["type"] for o in got["output"]] == ["reasoning", "message"]
    assert got["output"][1]["content"][0]["text"] == expected["output"][1]["content"][0]["text"]
    assert got["output"][0]["content"][0]["text"] == expected["output"][0]["content"][0]["text"]
    if coalesce:  # fewer deltas than tokens: the appends' text merged
        assert deltas(events) < deltas(uncut[: len(events)])


def test_tokens_that_do_not_make_the_log_cannot_be_replayed() -> None:
    writes = split(TOKENS[:CUT], [3, 4, 6])
    events = logged(writes, coalesce=True)
    other = ENC.encode(
        "<|channel|>final<|message|>Something else entirely here.", allowed_special="all"
    )
    with pytest.raises(CannotReplay):
        replay(
            events,
            [other],
            new_decoder=lambda b: HarmonyDecoder(ENC, b),
            new_id=lambda p: f"{p}_new",
        )
