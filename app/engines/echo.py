"""The echo engine: answers with the last user message, so the server runs without a model.

It reads the prompt token ids the service rendered, finds the last user message, and streams a
Harmony completion for it token by token: an analysis message, then a final answer repeating the
user's words. It honours ``max_tokens`` (``finish_reason="length"``) and ``abort``.

It can also continue a response another server started (``Sampling.generated``): the prompt then
ends with that response's output so far, and since echo's answer is a function of the original
prompt alone, it recomputes that answer, checks that the generated tokens are its beginning, and
streams the rest. A continuation whose generated tokens are not its answer is refused with
``EngineError``: streaming anything after them would splice two different completions.
"""

from __future__ import annotations

import asyncio
import os
import re
import struct
import sys
import time
from array import array
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

from openai_harmony import HarmonyEncoding

from app.engines.protocol import EngineChunk, EngineError, Sampling

__all__ = ["EchoEngine", "StepClock", "echo_completion", "stream_tokens", "token_times_record", "write_token_times"]

_YIELD_EVERY = 16
_LAST_USER = re.compile(r"<\|start\|>user<\|message\|>(.*?)<\|end\|>", re.DOTALL)


def echo_completion(encoding: HarmonyEncoding, prompt_token_ids: Sequence[int]) -> str:
    """The raw Harmony completion echo answers with."""
    prompt = encoding.decode(list(prompt_token_ids))
    users = _LAST_USER.findall(prompt)
    said = users[-1] if users else ""
    return (
        f"<|channel|>analysis<|message|>The user said: {said}<|end|>"
        f"<|start|>assistant<|channel|>final<|message|>{said}<|return|>"
    )


class StepClock:
    """Paces streams as an engine's steps do: every stream waiting for the next step wakes at it.

    One timer per step for all the streams, not one per stream per token: at 256 streams a
    timer each cost more than the server's whole work per token, and a real engine (vLLM's step
    loop) also hands every running request its next token at once."""

    def __init__(self, interval_s: float) -> None:
        self._interval = interval_s
        self._waiters: list[asyncio.Future[None]] = []

    def step(self) -> asyncio.Future[None]:
        """A future of the caller's own that resolves at the next step (scheduled one interval
        from now if none is pending); cancelling it leaves the other streams' alone."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        if not self._waiters:
            loop.call_later(self._interval, self._tick)
        self._waiters.append(waiter)
        return waiter

    def _tick(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


async def stream_tokens(
    token_ids: Sequence[int],
    sampling: Sampling,
    *,
    aborted: asyncio.Event,
    clock: StepClock | None = None,
    error: str | None = None,
    times: array | None = None,
    before_last: Callable[[], None] | None = None,
    on_close: Callable[[], None] | None = None,
) -> AsyncIterator[EngineChunk]:
    """Stream ``token_ids`` one at a time as an engine would: stop at a stop token, cut at
    ``max_tokens``, end early on abort, and end with ``error`` if one is given. ``times`` (when
    given) gets the ``monotonic_ns`` of each token's yield; with a ``clock``, each token waits for
    its next step; ``before_last`` runs just before the chunk that carries the finish reason; ``on_close`` once the stream ends or is closed."""

    def last(chunk: EngineChunk) -> EngineChunk:
        if times is not None and chunk.token_ids:
            times.append(time.monotonic_ns())
        if before_last is not None:
            before_last()
        return chunk

    try:
        stops = set(sampling.stop_token_ids)
        limit = sampling.max_tokens
        for sent, token in enumerate(token_ids):
            if aborted.is_set():
                yield last(EngineChunk((), "abort"))
                return
            if limit is not None and sent >= limit:
                yield last(EngineChunk((), "length"))
                return
            if clock is not None:
                await clock.step()
            elif sent % _YIELD_EVERY == 0:
                # At zero delay the engine still lets other tasks run, every few tokens rather than
                # every token: a loop turn per token would make this test engine, not the server
                # under test, the main per-token cost in benchmarks.
                await asyncio.sleep(0)
            if token in stops:
                yield last(EngineChunk((token,), "stop"))
                return
            if times is not None:
                times.append(time.monotonic_ns())
            yield EngineChunk((token,))
        if error is not None:
            yield last(EngineChunk((), "error", error=error))
        else:
            yield last(EngineChunk((), "stop"))
    finally:
        if on_close is not None:
            on_close()


def token_times_record(request_id: str, times: Sequence[int]) -> bytes:
    """One request's token-times record (the format ``bench.token_times`` reads): the id's length
    (``<H``) and UTF-8 bytes, the count (``<I``), then a little-endian int64 ``monotonic_ns`` per
    output token."""
    key = request_id.encode()
    if not key or len(key) > 0xFFFF:
        raise ValueError(f"not a usable request id: {request_id!r}")
    data = array("q", times)
    if sys.byteorder != "little":
        data.byteswap()
    return struct.pack("<H", len(key)) + key + struct.pack("<I", len(data)) + data.tobytes()


def write_token_times(directory: Path, request_id: str, times: Sequence[int]) -> Path:
    """Append ``request_id``'s record to this process's ``<directory>/<pid>.times``, in one
    ``write``; returns the file. One file a process, opened for each record, not a file a
    request: creating a file waits on the disk's journal while a database fsyncs, and this runs
    in the event loop (``bench.token_times``)."""
    path = directory / f"{os.getpid()}.times"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, token_times_record(request_id, times))
    finally:
        os.close(fd)
    return path


class EchoEngine:
    vocab_size = 201088
    max_model_len: int | None = None
    #: Its answer is fixed by the prompt (or the script): it cannot enforce a grammar, and is
    #: never given one (structured outputs are shown to the model in the prompt only).
    constrains = False
    #: Its tokens are not sampled from a distribution: there are no log probabilities to give.
    supports_logprobs = False

    def __init__(self, encoding: HarmonyEncoding, model_names: Sequence[str]) -> None:
        self._encoding = encoding
        self.model_names = tuple(model_names)
        self._aborted: dict[str, asyncio.Event] = {}
        self._encoded: dict[str, list[int]] = {}
        #: One step clock per token delay: paced streams advance together, as in an engine.
        self._clocks: dict[float, StepClock] = {}
        #: Where to write each request's token yield times (the benchmark's latency side channel).
        self.token_times_dir: Path | None = None
        #: Request ids abort() was called for (tests check that dropped streams are aborted).
        self.aborted_requests: list[str] = []

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        for event in self._aborted.values():
            event.set()

    def healthy(self) -> bool:
        return True

    async def abort(self, request_id: str) -> None:
        self.aborted_requests.append(request_id)
        event = self._aborted.get(request_id)
        if event is not None:
            event.set()

    def _tokens(self, text: str) -> list[int]:
        cached = self._encoded.get(text)
        if cached is None:
            cached = self._encoding.encode(text, allowed_special="all")
            if len(self._encoded) < 64:  # scripted turns repeat; echoes mostly do not
                self._encoded[text] = cached
        return cached

    def completion_for(self, prompt_token_ids: Sequence[int]) -> tuple[str, float, str | None]:
        """The completion to stream for a new response, its token delay (s) and its error."""
        return echo_completion(self._encoding, prompt_token_ids), 0.0, None

    def continuation_for(
        self, prompt_token_ids: Sequence[int], generated: int
    ) -> tuple[str, float, str | None]:
        """The whole completion a continued response resumes (as :meth:`completion_for`).

        Echo's answer to the original prompt, the prompt without its last ``generated`` tokens;
        calls ``echo_completion`` itself, not ``completion_for``, which a subclass may give side
        effects (the scripted engine's turn counter)."""
        original = prompt_token_ids[: len(prompt_token_ids) - generated]
        return echo_completion(self._encoding, original), 0.0, None

    def _continued(
        self, prompt_token_ids: Sequence[int], generated: int
    ) -> tuple[Sequence[int], float, str | None]:
        """The tokens after the ``generated`` ones of the completion being continued."""
        if not 0 < generated <= len(prompt_token_ids):
            raise EngineError(
                f"cannot continue this response: {generated} generated tokens in a prompt of "
                f"{len(prompt_token_ids)}"
            )
        text, delay_s, error = self.continuation_for(prompt_token_ids, generated)
        tokens = self._tokens(text)
        if tokens[:generated] != list(prompt_token_ids[len(prompt_token_ids) - generated :]):
            raise EngineError(
                "cannot continue this response: the generated tokens are not this engine's completion"
            )
        return tokens[generated:], delay_s, error

    def generate(
        self, prompt_token_ids: Sequence[int], sampling: Sampling, request_id: str
    ) -> AsyncIterator[EngineChunk]:
        # Not itself a generator: it hands back stream_tokens' iterator, so a token crosses
        # one async generator, not two; and a continuation it cannot serve raises here, before
        # the service has begun to read a stream.
        tokens: Sequence[int]
        if sampling.generated:
            tokens, delay_s, error = self._continued(prompt_token_ids, sampling.generated)
        else:
            text, delay_s, error = self.completion_for(prompt_token_ids)
            tokens = self._tokens(text)
        clock = None
        if delay_s:
            clock = self._clocks.get(delay_s) or self._clocks.setdefault(delay_s, StepClock(delay_s))
        aborted = self._aborted.setdefault(request_id, asyncio.Event())
        times = array("q") if self.token_times_dir is not None else None
        directory = self.token_times_dir

        def write_times() -> None:
            if times is not None and directory is not None:
                write_token_times(directory, request_id, times)

        return stream_tokens(
            tokens,
            sampling,
            aborted=aborted,
            clock=clock,
            error=error,
            times=times,
            before_last=write_times,
            on_close=lambda: self._aborted.pop(request_id, None),
        )
