"""The echo engine: answers with the last user message, so the server runs without a model.

It reads the prompt token ids the service rendered, finds the last user message, and streams a
Harmony completion for it token by token: an analysis message, then a final answer repeating the
user's words. It honours ``max_tokens`` (``finish_reason="length"``) and ``abort``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Sequence

from openai_harmony import HarmonyEncoding

from app.engines.protocol import EngineChunk, Sampling

__all__ = ["EchoEngine", "echo_completion", "stream_tokens"]

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


async def stream_tokens(
    token_ids: Sequence[int],
    sampling: Sampling,
    *,
    aborted: asyncio.Event,
    delay_s: float = 0.0,
    error: str | None = None,
) -> AsyncIterator[EngineChunk]:
    """Stream ``token_ids`` one at a time as an engine would: stop at a stop token, cut at
    ``max_tokens``, end early on abort, and end with ``error`` if one is given."""
    stops = set(sampling.stop_token_ids)
    limit = sampling.max_tokens
    for sent, token in enumerate(token_ids):
        if aborted.is_set():
            yield EngineChunk((), "abort")
            return
        if limit is not None and sent >= limit:
            yield EngineChunk((), "length")
            return
        if delay_s:
            await asyncio.sleep(delay_s)
        else:
            await asyncio.sleep(0)
        if token in stops:
            yield EngineChunk((token,), "stop")
            return
        yield EngineChunk((token,))
    if error is not None:
        yield EngineChunk((), "error", error=error)
    else:
        yield EngineChunk((), "stop")


class EchoEngine:
    vocab_size = 201088
    max_model_len: int | None = None

    def __init__(self, encoding: HarmonyEncoding, model_names: Sequence[str]) -> None:
        self._encoding = encoding
        self.model_names = tuple(model_names)
        self._aborted: dict[str, asyncio.Event] = {}
        self._encoded: dict[str, list[int]] = {}
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
        return echo_completion(self._encoding, prompt_token_ids), 0.0, None

    async def generate(
        self, prompt_token_ids: Sequence[int], sampling: Sampling, request_id: str
    ) -> AsyncIterator[EngineChunk]:
        text, delay_s, error = self.completion_for(prompt_token_ids)
        tokens = self._tokens(text)
        aborted = self._aborted.setdefault(request_id, asyncio.Event())
        try:
            async for chunk in stream_tokens(
                tokens, sampling, aborted=aborted, delay_s=delay_s, error=error
            ):
                yield chunk
        finally:
            self._aborted.pop(request_id, None)
