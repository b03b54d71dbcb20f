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
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from pathlib import Path

from openai_harmony import HarmonyEncoding

from app.engines.protocol import EngineChunk, EngineError, Pushable, Sampling

__all__ = [
    "EchoEngine",
    "StepClock",
    "StepStream",
    "echo_completion",
    "stream_tokens",
    "token_times_record",
    "write_token_times",
]

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
    loop) also hands every running request its next token at once. A stream waits for a step
    with a future (``step``, for a consumer that reads it) or has a call made at it
    (``call_at_step``, for one the engine pushes to: no future and no task switch a token).

    The steps run on a fixed grid while any stream takes them, as a GPU's do: an engine (vLLM's
    engine core, a process of its own) does not step later because its frontend's event loop
    was busy. A step the loop comes to late is followed by the next one on time (or at once, if
    that is due already); a step that no stream waited for stops the clock, and the next stream
    that asks starts it again one step away."""

    def __init__(self, interval_s: float) -> None:
        self._interval = interval_s
        self._waiters: list[asyncio.Future[None]] = []
        self._calls: list[Callable[[], None]] = []
        self._due: float | None = None  # the next step's time while the clock runs

    def _schedule(self) -> None:
        if self._due is None:  # stopped: a stream's first step is one step away
            loop = asyncio.get_running_loop()
            self._due = loop.time() + self._interval
            loop.call_at(self._due, self._tick)

    def step(self) -> asyncio.Future[None]:
        """A future of the caller's own that resolves at the next step (the clock starts if it
        is stopped); cancelling it leaves the other streams' alone."""
        self._schedule()
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        return waiter

    def call_at_step(self, call: Callable[[], None]) -> None:
        """Call ``call`` at the next step (the clock starts if it is stopped)."""
        self._schedule()
        self._calls.append(call)

    def _tick(self) -> None:
        waiters, self._waiters = self._waiters, []
        calls, self._calls = self._calls, []
        if not waiters and not calls:
            self._due = None
            return
        loop = asyncio.get_running_loop()
        assert self._due is not None
        self._due = max(self._due + self._interval, loop.time())
        loop.call_at(self._due, self._tick)
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        for call in calls:
            call()


class _Tokens:
    """What a stream of given tokens sends next, as an engine would: stop at a stop token, cut
    at ``max_tokens``, end early on abort, and end with ``error`` if one is given. ``times``
    (when given) gets the ``monotonic_ns`` of each token sent; ``before_last`` runs just before
    the chunk that carries the finish reason is sent."""

    __slots__ = ("_aborted", "_before_last", "_error", "_limit", "_stops", "_times", "_tokens")

    def __init__(
        self,
        token_ids: Sequence[int],
        sampling: Sampling,
        aborted: asyncio.Event,
        error: str | None,
        times: array[int] | None,
        before_last: Callable[[], None] | None,
    ) -> None:
        self._tokens = token_ids
        self._stops = set(sampling.stop_token_ids)
        self._limit = sampling.max_tokens
        self._aborted = aborted
        self._error = error
        self._times = times
        self._before_last = before_last

    def ending(self, sent: int) -> EngineChunk | None:
        """The last chunk, if the stream ends before its token ``sent`` (no step is waited
        for it): aborted, ``max_tokens`` reached, no tokens left."""
        if self._aborted.is_set():
            return self._last(EngineChunk((), "abort"))
        if self._limit is not None and sent >= self._limit:
            return self._last(EngineChunk((), "length"))
        if sent >= len(self._tokens):
            if self._error is not None:
                return self._last(EngineChunk((), "error", error=self._error))
            return self._last(EngineChunk((), "stop"))
        return None

    def token(self, sent: int) -> EngineChunk:
        """The chunk of token ``sent`` (its step has come; ``ending(sent)`` was None)."""
        token = self._tokens[sent]
        if token in self._stops:
            return self._last(EngineChunk((token,), "stop"))
        if self._times is not None:
            self._times.append(time.monotonic_ns())
        return EngineChunk((token,))

    def _last(self, chunk: EngineChunk) -> EngineChunk:
        if self._times is not None and chunk.token_ids:
            self._times.append(time.monotonic_ns())
        if self._before_last is not None:
            self._before_last()
        return chunk


def stream_tokens(
    token_ids: Sequence[int],
    sampling: Sampling,
    *,
    aborted: asyncio.Event,
    clock: StepClock | None = None,
    error: str | None = None,
    times: array[int] | None = None,
    before_last: Callable[[], None] | None = None,
    on_close: Callable[[], None] | None = None,
) -> AsyncGenerator[EngineChunk, None]:
    """Stream ``token_ids`` one at a time (see ``_Tokens``); with a ``clock``, each token waits
    for its next step; ``on_close`` once the stream ends or is closed."""
    return _read(_Tokens(token_ids, sampling, aborted, error, times, before_last), clock, on_close)


async def _read(
    script: _Tokens, clock: StepClock | None, on_close: Callable[[], None] | None
) -> AsyncGenerator[EngineChunk, None]:
    try:
        sent = 0
        while True:
            end = script.ending(sent)
            if end is not None:
                yield end
                return
            if clock is not None:
                await clock.step()
            elif sent % _YIELD_EVERY == 0:
                # At zero delay the engine still lets other tasks run, every few tokens rather than
                # every token: a loop turn per token would make this test engine, not the server
                # under test, the main per-token cost in benchmarks.
                await asyncio.sleep(0)
            chunk = script.token(sent)
            sent += 1
            yield chunk
            if chunk.finish_reason is not None:
                return
    finally:
        if on_close is not None:
            on_close()


class StepStream(Pushable):
    """A paced stream its clock pushes (``app.engines.protocol.PushedChunks``): at each step the
    clock calls it, and it hands that step's token to the consumer's sink in the same call, as
    an engine's step loop hands every running request its output. Read with ``async for``, it
    is ``stream_tokens`` with the clock."""

    def __init__(self, script: _Tokens, clock: StepClock, on_close: Callable[[], None]) -> None:
        self._script = script
        self._clock = clock
        self._on_close: Callable[[], None] | None = on_close
        self._sent = 0

    def _open_reader(self) -> AsyncGenerator[EngineChunk, None]:
        on_close, self._on_close = self._on_close, None  # (the reader closes it)
        return _read(self._script, self._clock, on_close)

    def _begin(self) -> None:
        end = self._script.ending(0)
        if end is not None:
            self._send(end)
        else:
            self._clock.call_at_step(self._step)

    def close(self) -> None:
        super().close()
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()

    def _step(self) -> None:
        if self._sink is None:  # closed while it waited for the step
            return
        sent = self._sent
        self._sent = sent + 1
        script = self._script
        try:  # (``before_last`` writes a file): this stream's failure, not the step's
            chunk = script.token(sent)
            wait = self._send(chunk)
            if chunk.finish_reason is not None or self._sink is None:
                return
            end = script.ending(sent + 1)
        except Exception as exc:
            self._fail(exc)
            return
        if end is not None:
            self._send(end)
        elif wait is None:
            self._clock.call_at_step(self._step)
        else:  # the consumer is behind: its next token waits for it, then for a step
            asyncio.ensure_future(wait).add_done_callback(self._resume)

    def _resume(self, _: asyncio.Future[None]) -> None:
        if self._sink is not None:
            self._clock.call_at_step(self._step)


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
        # Not itself a generator: it hands back the tokens' reader (or a paced stream's
        # StepStream), so a token crosses one async generator, not two; and a continuation it
        # cannot serve raises here, before the service has begun to read a stream.
        tokens: Sequence[int]
        if sampling.generated:
            tokens, delay_s, error = self._continued(prompt_token_ids, sampling.generated)
        else:
            text, delay_s, error = self.completion_for(prompt_token_ids)
            tokens = self._tokens(text)
        clock = None
        if delay_s:
            clock = self._clocks.get(delay_s) or self._clocks.setdefault(
                delay_s, StepClock(delay_s)
            )
        aborted = self._aborted.setdefault(request_id, asyncio.Event())
        times = array("q") if self.token_times_dir is not None else None
        directory = self.token_times_dir

        def write_times() -> None:
            if times is not None and directory is not None:
                write_token_times(directory, request_id, times)

        def on_close() -> None:
            self._aborted.pop(request_id, None)

        script = _Tokens(tokens, sampling, aborted, error, times, write_times)
        if clock is not None:  # paced: its steps push the tokens (``PushedChunks``)
            return StepStream(script, clock, on_close)
        return _read(script, None, on_close)
