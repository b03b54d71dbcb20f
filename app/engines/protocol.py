"""The contract every engine implements.

An engine knows nothing about Harmony, HTTP or the event log: it receives prompt token ids and
streams back new token ids. The service renders prompts and decodes output (``domain.prompt`` and
``domain.decoder``), so the echo, scripted and vLLM engines are interchangeable.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from domain.events import fast_init
from domain.logprobs import TokenLogprob

FinishReason = Literal["stop", "length", "abort", "error"]


@dataclass(frozen=True, slots=True)
class Sampling:
    """What the service asks of one generation."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    # Always set by the service: the ids of <|return|> and <|call|>.
    stop_token_ids: tuple[int, ...] = ()
    # token id -> bias; lets tests force a stop token on a random-weight model.
    logit_bias: dict[int, float] = field(default_factory=dict)
    # The last `generated` prompt token ids are this response's own output so far (a takeover
    # continuing it on another server): the engine continues after them. `max_tokens` counts new
    # tokens only. vLLM needs nothing more (a continuation is just a longer prompt); the echo and
    # scripted engines, whose answer is fixed by the prompt or the script, use it to find the
    # completion being continued and resume it after its first `generated` tokens.
    generated: int = 0
    #: An llguidance Lark grammar for everything generated (``app.constraints``), or None. Only an
    #: engine whose ``constrains`` is true is ever given one.
    grammar: str | None = None
    #: None: no log probabilities. ``k`` (0..20): each output token's log probability and those
    #: of the ``k`` most likely tokens at its position (``EngineChunk.logprobs``). Only engines
    #: whose ``supports_logprobs`` is True are asked.
    logprobs: int | None = None


@dataclass(frozen=True, slots=True)
class EngineChunk:
    """New output token ids; the last chunk of a generation carries ``finish_reason``.

    ``finish_reason``: ``stop`` (a stop token ended it; the stop token is included in
    ``token_ids``), ``length`` (``max_tokens`` reached), ``abort`` (``abort`` was called),
    ``error`` (the engine failed; ``error`` says how).

    ``logprobs``: only when ``Sampling.logprobs`` asked for them, one per token id, in order:
    ``(logprob, [(token id, logprob), ...])``, the top-k most likely first (none when k is 0).
    """

    token_ids: Sequence[int]
    finish_reason: FinishReason | None = None
    num_cached_tokens: int | None = None
    error: str | None = None
    logprobs: Sequence[TokenLogprob] | None = None


fast_init(EngineChunk)  # one is made per token


#: Where a pushed stream hands its chunks (:class:`PushedChunks`): called with each chunk, in
#: order, from the engine's step; it returns None to have the next one at the next step, or an
#: awaitable to have it only once that is done (the log is behind: backpressure).
ChunkSink = Callable[[EngineChunk], Awaitable[None] | None]


@runtime_checkable
class PushedChunks(Protocol):
    """A generation an engine can *push*: what ``generate`` returns when its steps can hand each
    chunk straight to the consumer, in the step's own call, instead of waking a task of the
    consumer's for every token (one future, one task switch and two generator resumptions a
    token, at every step, for every stream). Still an async iterator of the same chunks, for
    consumers that read it so."""

    def __aiter__(self) -> AsyncIterator[EngineChunk]: ...

    def __anext__(self) -> Awaitable[EngineChunk]: ...

    def push_to(self, sink: ChunkSink) -> asyncio.Future[None]:
        """Hand every chunk to ``sink``, the last one (its ``finish_reason`` set) included; the
        future resolves after the last, or fails with what ``sink`` raised (nothing more is
        pushed then). Once per generation, and not together with iterating it."""
        ...

    def close(self) -> None:
        """Push nothing more (the consumer went away); the generation's resources are freed."""
        ...


class Pushable:
    """What a :class:`PushedChunks` implementation shares: its reading side (``async for``,
    ``anext`` and ``aclose`` go to the one generator ``_open_reader`` makes, on first use) and
    its pushing side (``push_to`` hands the sink over and calls ``_begin``; ``_send`` gives the
    sink a chunk and ends the push after the last one, or when the sink fails). A generation is
    read or pushed, never both."""

    _reader: AsyncGenerator[EngineChunk, None] | None = None
    _sink: ChunkSink | None = None
    _done: asyncio.Future[None] | None = None
    #: The last chunk was pushed: nothing is left to abort.
    _finished = False

    def __aiter__(self) -> AsyncIterator[EngineChunk]:
        return self._read()

    def __anext__(self) -> Awaitable[EngineChunk]:
        return self._read().__anext__()

    def aclose(self) -> Awaitable[None]:
        return self._read().aclose()

    def _read(self) -> AsyncGenerator[EngineChunk, None]:
        if self._reader is None:
            assert self._done is None, "read or pushed, not both"
            self._reader = self._open_reader()
        return self._reader

    def _open_reader(self) -> AsyncGenerator[EngineChunk, None]:
        raise NotImplementedError

    def push_to(self, sink: ChunkSink) -> asyncio.Future[None]:
        assert self._done is None and self._reader is None, "pushed once, not read"
        self._sink = sink
        self._done = asyncio.get_running_loop().create_future()
        self._begin()
        return self._done

    def _begin(self) -> None:
        """Start pushing (``push_to`` has set the sink)."""
        raise NotImplementedError

    def close(self) -> None:
        self._sink = None

    def _send(self, chunk: EngineChunk) -> Awaitable[None] | None:
        """Hand ``chunk`` to the sink (none once closed); returns what the sink asked to wait for.
        After the last chunk, or when the sink fails, the push is over (``push_to``'s future
        says how): the sink's exception never reaches the engine's step."""
        sink, done = self._sink, self._done
        if sink is None or done is None:
            return None
        try:
            wait = sink(chunk)
        except BaseException as exc:  # (a Rust panic is not an Exception): the consumer's to see
            self._fail(exc)
            return None
        if chunk.finish_reason is not None:
            self._finished = True
            self.close()
            if not done.done():
                done.set_result(None)
        return wait

    def _fail(self, exc: BaseException) -> None:
        done = self._done
        self.close()
        if done is not None and not done.done():
            done.set_exception(exc)


class EngineError(Exception):
    """The engine cannot serve this request (bad prompt, engine dead)."""


class PromptTooLong(EngineError):
    def __init__(self, prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> None:
        super().__init__(
            f"The prompt has {prompt_tokens} tokens and max_output_tokens is {max_tokens}; "
            f"the model's context length is {max_model_len}."
        )
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.max_model_len = max_model_len


class Engine(Protocol):
    """Streams token ids for a prompt. One instance serves many concurrent requests."""

    #: Model names this engine answers to (the first one is the canonical name).
    model_names: tuple[str, ...]
    #: Largest valid token id + 1; prompt ids are checked against it before generate().
    vocab_size: int
    #: Context length (prompt + output), or None when unbounded.
    max_model_len: int | None
    #: Whether the engine enforces ``Sampling.grammar`` (structured outputs).
    constrains: bool
    #: Whether it can honour ``Sampling.logprobs``; a request for them to an engine that cannot
    #: is refused before generation.
    supports_logprobs: bool

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def healthy(self) -> bool: ...

    def generate(
        self, prompt_token_ids: Sequence[int], sampling: Sampling, request_id: str
    ) -> AsyncIterator[EngineChunk]:
        """The generation's chunks; an engine that can push them from its steps returns a
        :class:`PushedChunks` (the service then uses ``push_to``)."""
        ...

    async def abort(self, request_id: str) -> None: ...
