"""Where a response's engine output goes: each chunk's tokens through the decoder and the
builder into the log writer, whether the engine's steps push the chunks or the service reads them.

A paced engine (one that hands every running request its next token at each step) can *push*
its chunks (``app.engines.protocol.PushedChunks``): the step calls :class:`ChunkFeed` for each
stream in turn, and a token then costs no future, no task switch and no generator resumption of
the response's own (measured: ~4 µs a token at 256 paced streams, of ~50, see bench/RESULTS.md).
Any other engine's chunks are read with ``async for``; both go through the same
:meth:`ChunkFeed.__call__`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import cast

from app.engines.protocol import EngineChunk, PushedChunks
from app.live import Backlog, LogWriter
from domain.builder import ResponseBuilder
from domain.decoder import HarmonyDecoder
from persistence.health import StoreHealth

__all__ = ["BACKLOG_BUDGET", "MIN_BACKLOG", "ChunkFeed", "Paced"]

#: Generation pauses when all live responses together have this many events waiting for their
#: commits (for a coalescing builder, tokens: ``app.live.Backlog``), for each response that
#: itself has at least ``MIN_BACKLOG`` waiting: a lone fast stream is never throttled, many
#: streams share a bounded buffer.
BACKLOG_BUDGET = 16384
MIN_BACKLOG = 32

#: Whether a type of generation is ``PushedChunks``, by type: a runtime-checkable protocol's
#: ``isinstance`` collects the protocol's members on every call (~50 µs under a profiler, once
#: a response), and an engine's generations are of one or two types.
_PUSHED: dict[type, bool] = {}


class Paced:
    """How many generations run now whose engine paces them (pushes their chunks at its steps,
    ``PushedChunks``): while any does, a burst of new responses' set-ups pauses for them
    (``app.turns``). An engine that hands its chunks over as fast as they are read has no step
    for its streams to keep, and there a pause would only delay the new responses."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def __bool__(self) -> bool:
        return self.count > 0


class ChunkFeed:
    """One response's chunks, fed to its decoder (which appends to its builder) and pushed to
    its writer with the tokens that made them. Records what the last chunk says:
    ``finish_reason``, ``error``, and the prompt's ``cached`` tokens."""

    __slots__ = (
        "_backlog",
        "_builder",
        "_coalesce",
        "_decoder",
        "_health",
        "_hold_last",
        "_paced",
        "_writer",
        "cached",
        "error",
        "finish_reason",
        "output_ids",
    )

    def __init__(
        self,
        decoder: HarmonyDecoder,
        builder: ResponseBuilder,
        writer: LogWriter,
        backlog: Backlog,
        health: StoreHealth,
        output_ids: list[int],
        *,
        hold_last: bool,
        paced: Paced | None = None,
    ) -> None:
        """``output_ids``: every output token id is appended to it. ``hold_last``: the last
        chunk's events stay in the builder, for the caller to push with the terminal events
        right after (one commit for both). ``paced``: counts the generation while it runs if
        its engine pushes its chunks."""
        self._decoder = decoder
        self._builder = builder
        self._writer = writer
        self._backlog = backlog
        self._health = health
        self._hold_last = hold_last
        self._paced = paced
        self._coalesce = builder.coalesce
        self.output_ids = output_ids
        self.cached = 0
        self.finish_reason: str | None = None
        self.error: str | None = None

    def __call__(self, chunk: EngineChunk) -> asyncio.Future[None] | None:
        """Take one chunk; returns a future to wait for before the next one when the log is
        behind (engines faster than the commits, or a database being retried: memory and the
        engine-to-client latency stay bounded), else None."""
        wait = None
        token_ids = chunk.token_ids
        if token_ids:
            self.output_ids.extend(token_ids)
            if chunk.logprobs is None:
                self._decoder.feed(token_ids)
            else:
                self._decoder.feed_logprobs(token_ids, chunk.logprobs)
            writer = self._writer
            # while a commit is in flight a coalescing builder keeps the text for the next one
            # (``LogWriter.pull``)
            hold = (chunk.finish_reason is not None and self._hold_last) or (
                self._coalesce and writer.inflight
            )
            writer.push(() if hold else self._builder.take(), token_ids)
            if (
                self._backlog.total >= BACKLOG_BUDGET or self._health.failing
            ) and writer.backlog >= MIN_BACKLOG:
                wait = writer.next_commit()
        if chunk.num_cached_tokens is not None:
            self.cached = chunk.num_cached_tokens
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason
            self.error = chunk.error
        return wait

    async def run(self, chunks: AsyncIterator[EngineChunk]) -> None:
        """Feed every chunk of a generation, up to the one with its finish reason; what the
        engine raises, or the feed (the decoder, the writer), propagates."""
        pushed = _PUSHED.get(type(chunks))
        if pushed is None:
            pushed = _PUSHED[type(chunks)] = isinstance(chunks, PushedChunks)
        if pushed:
            stream = cast(PushedChunks, chunks)  # (known by its type)
            paced = self._paced
            if paced is not None:
                paced.count += 1
            try:
                await stream.push_to(self)
            finally:
                stream.close()
                if paced is not None:
                    paced.count -= 1
            return
        async for chunk in chunks:
            wait = self(chunk)
            if wait is not None:
                await wait
            if self.finish_reason is not None:
                break
