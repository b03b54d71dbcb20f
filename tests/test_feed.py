"""Where an engine's chunks go (app.feed): through the decoder and the builder into the log
writer, and the shared budget that pauses a fast engine while its commits lag."""

from __future__ import annotations

import pytest

from app import feed as feed_module
from app.encoding import load_encoding
from app.engines.protocol import EngineChunk
from app.feed import ChunkFeed
from app.live import Backlog, LogWriter, Run
from domain.builder import ResponseBuilder
from domain.decoder import HarmonyDecoder
from persistence.health import StoreHealth
from tests.domain.factories import counter_ids, response_skeleton
from tests.test_live import _Store

ENC = load_encoding()


async def test_a_fast_engine_is_paused_when_the_budget_holds_as_many_tokens_as_it_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While a commit is in flight each token's delta waits for the next one; the engine is
    told to wait (``ChunkFeed`` returns a future) once the waiting events fill the budget: after
    as many tokens as the budget holds, not half as many (a token and its delta counted once)."""
    monkeypatch.setattr(feed_module, "BACKLOG_BUDGET", 8)
    monkeypatch.setattr(feed_module, "MIN_BACKLOG", 1)
    store = _Store()
    backlog = Backlog()
    run = Run(id="resp_1", store=True, background=False, engine_request_id="resp_1")
    writer = LogWriter(run, store.submit_then, backlog)
    builder = ResponseBuilder(response_skeleton(), new_id=counter_ids())
    builder.created()
    feed = ChunkFeed(
        HarmonyDecoder(ENC, builder),
        builder,
        writer,
        backlog,
        StoreHealth(retry_s=1.0),
        [],
        hold_last=False,
    )
    header = ENC.encode("<|channel|>final<|message|>", allowed_special="all")
    assert feed(EngineChunk(token_ids=header)) is None  # handed over at once: now in flight
    assert writer.inflight and len(store.calls) == 1
    words = ENC.encode(" one two three four five six seven eight nine")
    assert len(words) == 9  # a token a word
    waits = [feed(EngineChunk(token_ids=[token])) for token in words]
    assert waits[:7] == [None] * 7  # 1-7 waiting: under the budget
    assert all(wait is not None for wait in waits[7:])  # 8 waiting deltas fill it
    assert backlog.total == writer.backlog == 9 and feed.output_ids == [*header, *words]
    store.settle(0)
    await waits[7]  # the commit in flight is durable: the engine goes on
    assert backlog.total == 0 and store.calls[1] == "events 3-11"
