"""Bringing a fresh decoder and builder to where a logged response stopped (a takeover).

The log holds the events, and each append holds the output token ids that produced its events
(``response_events.token_ids``), durable in the same transaction. Decoding is deterministic: the
same tokens fed to a fresh :class:`~domain.decoder.HarmonyDecoder` over a fresh
:class:`~domain.builder.ResponseBuilder` make the same events, except the ids the builder mints.
So :func:`replay` hands the builder the ids the log already has, in the order they were minted,
feeds every logged token, and checks that the logged events are a prefix of what it made (same
``seq``, same type, same item ids). A writer whose builder coalesced made one delta of the text
of all the tokens an append carried (``domain.builder``), so the replay feeds the tokens append
by append and takes the events after each, as the writer did, with a builder that coalesces or
not: the server's setting first, then the other (a log from a replica set otherwise). What the
replay made beyond the log (``pending``: e.g. the
``response.in_progress`` of a response whose owner died right after ``response.created``) is
new: the caller appends it. The parser, the open item and the usage counts are then exactly
where the dead writer's were, and generation goes on from there. Log probabilities are not in the
tokens: the open message gets the entries its logged deltas carried, so its ``.done`` still
carries them all (tokens of a character still unfinished at the log's end have none).
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from domain.builder import ResponseBuilder
from domain.decoder import HarmonyDecoder
from domain.events import Event, OutputItemAdded, OutputTextDelta, ResponseCreated, ResponseQueued

__all__ = ["CannotReplay", "Replayed", "replay"]


class CannotReplay(Exception):
    """The log and its tokens do not decode to the same events: it cannot be continued."""


@dataclass
class Replayed:
    builder: ResponseBuilder
    decoder: HarmonyDecoder
    #: Events the replay made past the end of the log: to append before anything else.
    pending: list[Event]


def _minted(events: Sequence[Event]) -> list[str]:
    """The ids the builder minted for the logged items, in minting order (an item's id, then a
    call's ``call_id``)."""
    ids: list[str] = []
    for event in events:
        if isinstance(event, OutputItemAdded):
            ids.append(str(event.item["id"]))
            if "call_id" in event.item:
                ids.append(str(event.item["call_id"]))
    return ids


def replay(
    events: Sequence[Event],
    writes: Sequence[Sequence[int]],
    *,
    new_decoder: Callable[[ResponseBuilder], HarmonyDecoder],
    new_id: Callable[[str], str],
    encrypt_reasoning: Callable[[str], str] | None = None,
    coalesce: bool = False,
) -> Replayed:
    """A builder and decoder in the state the log's writer was in after its last append.
    ``writes``: the output token ids of each append that carried some, in order.
    ``coalesce``: how the builder goes on (the server's setting), whichever way the log was made.
    ``new_decoder(builder)``: a decoder as the response's creator made it (custom tools,
    prefill, namespaced functions)."""
    if not events or not isinstance(events[0], ResponseCreated):
        raise CannotReplay("the log does not start with response.created")
    attempt = functools.partial(_replay, events, writes, new_decoder, new_id, encrypt_reasoning)
    try:
        replayed = attempt(coalesce=coalesce)
    except CannotReplay as first:
        try:  # written by a replica whose setting was the other
            replayed = attempt(coalesce=not coalesce)
        except CannotReplay:
            raise first from None
    replayed.builder.coalesce = coalesce
    return replayed


def _replay(
    events: Sequence[Event],
    writes: Sequence[Sequence[int]],
    new_decoder: Callable[[ResponseBuilder], HarmonyDecoder],
    new_id: Callable[[str], str],
    encrypt_reasoning: Callable[[str], str] | None,
    *,
    coalesce: bool,
) -> Replayed:
    known = collections.deque(_minted(events))

    def mint(prefix: str) -> str:
        if known:
            ident = known.popleft()
            if not ident.startswith(prefix + "_"):
                raise CannotReplay(
                    f"the replay opened a {prefix!r} item where the log has {ident!r}"
                )
            return ident
        return new_id(prefix)

    first = events[0]
    assert isinstance(first, ResponseCreated)
    builder = ResponseBuilder(
        first.response, new_id=mint, encrypt_reasoning=encrypt_reasoning, coalesce=coalesce
    )
    builder.created(queued=any(isinstance(e, ResponseQueued) for e in events[:2]))
    builder.in_progress()
    decoder = new_decoder(builder)
    made = builder.take()  # (a prefilled call opens before any token: the writer took it so)
    for write in writes:
        decoder.feed(write)
        made += builder.take()
    if len(made) < len(events):
        raise CannotReplay(
            f"the logged tokens decode to {len(made)} events, the log has {len(events)}"
        )
    for logged, again in zip(events, made, strict=False):
        if (logged.sequence_number, logged.type) != (again.sequence_number, again.type):
            raise CannotReplay(
                f"event {logged.sequence_number}: the log has {logged.type}, the replay made "
                f"{again.type} (seq {again.sequence_number})"
            )
    open_item = builder.state.open_item
    if open_item is not None and open_item.item_type == "message":
        builder.carry_logprobs(
            [
                entry
                for event in events
                if isinstance(event, OutputTextDelta) and event.item_id == open_item.item_id
                for entry in event.logprobs
            ]
        )
    return Replayed(builder, decoder, list(made[len(events) :]))
