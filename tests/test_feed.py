"""Where an engine's chunks go (app.feed): through the decoder and the builder into the log
writer, and the shared budget that pauses a fast engine while its commits lag."""

from __future__ import annotations

from typing import Any

import pytest

from app import feed as feed_module
from app.encoding import load_encoding
from app.engines.protocol import EngineChunk, Sampling
from app.engines.scripted import ScriptedEngine
from app.feed import ChunkFeed, Paced
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


class _Watched(ChunkFeed):
    """A feed that notes, at each chunk, whether its generation is counted as paced."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.counted: list[bool] = []

    def __call__(self, chunk: EngineChunk) -> Any:
        self.counted.append(bool(self._paced))
        return super().__call__(chunk)


async def test_a_generation_its_engine_paces_is_counted_while_it_runs() -> None:
    """``Paced``, what a burst of new responses' set-ups pauses for (``app.turns``), counts a
    generation whose engine pushes its chunks at its steps while it runs; one its engine hands
    over as fast as it is read (the scripted engine unpaced) is not counted."""
    completion = "<|channel|>final<|message|>one two three four<|return|>"
    for delay_ms, counted in ((1, True), (0, False)):
        engine = ScriptedEngine(
            ENC, ["m"], {"turns": [{"completion": completion, "token_delay_ms": delay_ms}]}
        )
        paced = Paced()
        store = _Store()
        backlog = Backlog()
        run = Run(id="resp_1", store=True, background=False, engine_request_id="resp_1")
        builder = ResponseBuilder(response_skeleton(), new_id=counter_ids())
        builder.created()
        feed = _Watched(
            HarmonyDecoder(ENC, builder),
            builder,
            LogWriter(run, store.submit_then, backlog),
            backlog,
            StoreHealth(retry_s=1.0),
            [],
            hold_last=False,
            paced=paced,
        )
        prompt = ENC.encode("<|start|>user<|message|>count<|end|>", allowed_special="all")
        await feed.run(engine.generate(prompt, Sampling(), "resp_1"))
        assert feed.finish_reason == "stop" and len(feed.counted) >= 5
        assert feed.counted == [counted] * len(feed.counted), (delay_ms, feed.counted)
        assert not paced and paced.count == 0  # over: no longer counted
