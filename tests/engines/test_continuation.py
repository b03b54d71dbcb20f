"""Engines continue a response another replica started (``Sampling.generated``, issue 15).

Driven as the service drives a takeover: the prompt is the original prompt followed by the
response's logged output tokens, ``generated`` says how many of them there are, and
``max_tokens`` is what is left. The continued tokens must be exactly what the uninterrupted
generation would have streamed after the cut.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from app.encoding import load_encoding
from app.engines.echo import EchoEngine, StepClock
from app.engines.protocol import EngineChunk, EngineError, PromptTooLong, Sampling
from app.engines.scripted import ScriptedEngine
from app.engines.vllm import VllmEngine
from tests.engines.conftest import TINY_MAX_MODEL_LEN

ENC = load_encoding()
RETURN, CALL = 200002, 200012
STOPS = (RETURN, CALL)
PROMPT = ENC.encode(
    "<|start|>system<|message|>You are terse.<|end|>"
    "<|start|>user<|message|>continue me, please<|end|><|start|>assistant",
    allowed_special="all",
)
ALPHA = "<|channel|>final<|message|>alpha one<|return|>"
BETA = (
    "<|channel|>analysis<|message|>Thinking it over.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>beta two three four<|return|>"
)
GAMMA = "<|channel|>final<|message|>gamma calls<|call|>"


def encoded(text: str) -> list[int]:
    return ENC.encode(text, allowed_special="all")


def script(**changes: Any) -> dict[str, Any]:
    """Three turns: ALPHA and GAMMA share their first tokens, BETA is paced at 1 ms a token."""
    turns: list[dict[str, Any]] = [
        {"completion": ALPHA},
        {"completion": BETA, "token_delay_ms": 1},
        {"completion": GAMMA},
    ]
    return {"turns": turns, **changes}


async def run(
    engine: EchoEngine,
    prompt: Sequence[int],
    generated: Sequence[int] = (),
    max_tokens: int | None = None,
    request_id: str = "r",
) -> tuple[list[int], EngineChunk]:
    """The new tokens and the last chunk of one generation, as the service would ask for it."""
    sampling = Sampling(max_tokens=max_tokens, stop_token_ids=STOPS, generated=len(generated))
    chunks = [c async for c in engine.generate([*prompt, *generated], sampling, request_id)]
    assert all(c.finish_reason is None for c in chunks[:-1])
    return [t for c in chunks for t in c.token_ids], chunks[-1]


# -- echo ---------------------------------------------------------------------------------------


async def test_echo_continues_after_every_cut_as_if_never_cut() -> None:
    engine = EchoEngine(ENC, ["m"])
    full, last = await run(engine, PROMPT)
    assert last.finish_reason == "stop" and full[-1] == RETURN
    assert "continue me, please<|return|>" in ENC.decode_utf8(full)
    for n in range(1, len(full)):
        continued, tail = await run(engine, PROMPT, full[:n], request_id=f"cut-{n}")
        assert full[:n] + continued == full, n
        assert (tail.finish_reason, tail.token_ids) == (last.finish_reason, last.token_ids), n


async def test_echo_max_tokens_counts_only_the_new_tokens() -> None:
    engine = EchoEngine(ENC, ["m"])
    full, _ = await run(engine, PROMPT)
    continued, last = await run(engine, PROMPT, full[:4], max_tokens=3)
    assert continued == full[4:7] and last.finish_reason == "length"
    # The remaining budget is exactly what is left: the stop token still fits.
    continued, last = await run(engine, PROMPT, full[:4], max_tokens=len(full) - 4)
    assert full[:4] + continued == full and last.finish_reason == "stop"


async def test_echo_refuses_generated_tokens_that_are_not_its_completion() -> None:
    engine = EchoEngine(ENC, ["m"])
    full, _ = await run(engine, PROMPT)
    wrong = [*full[:3], full[3] + 1]
    # Raised by generate() itself, before any stream is read.
    with pytest.raises(EngineError, match="not this engine's completion"):
        engine.generate([*PROMPT, *wrong], Sampling(stop_token_ids=STOPS, generated=4), "bad")
    # More generated tokens than the whole completion has cannot be its beginning either.
    too_many = [*full, *full[:2]]
    with pytest.raises(EngineError, match="not this engine's completion"):
        engine.generate([*PROMPT, *too_many], Sampling(generated=len(too_many)), "long")
    for generated in (-1, len(PROMPT) + len(full) + 1):
        with pytest.raises(EngineError, match="cannot continue"):
            engine.generate([*PROMPT, *full], Sampling(generated=generated), f"g{generated}")


async def test_abort_ends_a_continued_stream() -> None:
    engine = EchoEngine(ENC, ["m"])
    full, _ = await run(engine, PROMPT)
    sampling = Sampling(stop_token_ids=STOPS, generated=2)
    stream = engine.generate([*PROMPT, *full[:2]], sampling, "taken")
    first = await anext(stream)
    assert list(first.token_ids) == full[2:3] and first.finish_reason is None
    await engine.abort("taken")
    rest = [c async for c in stream]
    assert rest == [EngineChunk((), "abort")] and "taken" in engine.aborted_requests


# -- scripted -----------------------------------------------------------------------------------


async def test_scripted_resumes_the_turn_it_continues_whatever_the_counter_says() -> None:
    engine = ScriptedEngine(ENC, ["m"], script())
    beta = encoded(BETA)
    # The counter points at ALPHA: the continuation still resumes BETA, at the right token.
    continued, last = await run(engine, PROMPT, beta[:7])
    assert beta[:7] + continued == beta and last.finish_reason == "stop"
    # It took no turn: the next new response gets ALPHA, then BETA.
    assert (await run(engine, PROMPT))[0] == encoded(ALPHA)
    assert (await run(engine, PROMPT))[0] == beta
    # The counter now points at GAMMA; a continuation of BETA again resumes BETA.
    continued, _ = await run(engine, PROMPT, beta[:12])
    assert beta[:12] + continued == beta
    assert (await run(engine, PROMPT))[0] == encoded(GAMMA)


async def test_scripted_continuations_are_recorded_as_prompts() -> None:
    engine = ScriptedEngine(ENC, ["m"], script())
    beta = encoded(BETA)
    await run(engine, PROMPT, beta[:5])
    assert engine.prompt_count == 1 and engine.prompts[-1] == [*PROMPT, *beta[:5]]


async def test_scripted_continuation_searches_every_turn_and_takes_the_first_match() -> None:
    alpha, gamma = encoded(ALPHA), encoded(GAMMA)
    shared = next(i for i, (a, g) in enumerate(zip(alpha, gamma, strict=False)) if a != g)
    assert shared >= 2  # "<|channel|>final<|message|>" begins both
    engine = ScriptedEngine(ENC, ["m"], script())
    # Within the shared beginning the first turn in the script wins.
    continued, _ = await run(engine, PROMPT, gamma[:shared])
    assert gamma[:shared] + continued == alpha
    # Past it, only GAMMA matches; its <|call|> ends the stream as it would have.
    continued, last = await run(engine, PROMPT, gamma[: shared + 1])
    assert gamma[: shared + 1] + continued == gamma and last.token_ids == (CALL,)
    # Turns already played, and turns of a cycling script, are searched alike.
    for changes in ({}, {"cycle": True}):
        played = ScriptedEngine(ENC, ["m"], script(**changes))
        for _ in range(3):
            await run(played, PROMPT)
        continued, _ = await run(played, PROMPT, alpha[:-1])
        assert continued == alpha[-1:]


class _CountingClock(StepClock):
    def __init__(self, interval_s: float) -> None:
        super().__init__(interval_s)
        self.waits = 0

    def step(self) -> asyncio.Future[None]:
        self.waits += 1
        return super().step()


async def test_scripted_continuation_keeps_the_turns_pacing_and_error() -> None:
    failing = BETA.removesuffix("<|return|>")  # the model fails before it would have stopped
    engine = ScriptedEngine(
        ENC, ["m"], {"turns": [{"completion": failing, "token_delay_ms": 1, "error": "boom"}]}
    )
    clock = _CountingClock(0.001)
    engine._clocks[0.001] = clock  # the engine's clock for the turn's 1 ms: count its steps
    beta = encoded(failing)
    continued, last = await run(engine, PROMPT, beta[:6], max_tokens=4)
    assert continued == beta[6:10] and last.finish_reason == "length"
    assert clock.waits == 4  # one step per continued token: paced like the turn
    # Its error ends it wherever it is cut, even after its last token.
    for n in (6, len(beta)):
        continued, last = await run(engine, PROMPT, beta[:n], request_id=f"e{n}")
        assert beta[:n] + continued == beta and (last.finish_reason, last.error) == (
            "error",
            "boom",
        )


async def test_an_exhausted_continuation_ends_with_stop() -> None:
    unstopped = "<|channel|>final<|message|>no stop token here"
    engine = ScriptedEngine(ENC, ["m"], {"turns": [{"completion": unstopped}]})
    tokens = encoded(unstopped)
    continued, last = await run(engine, PROMPT, tokens)
    assert continued == [] and last == EngineChunk((), "stop")


async def test_scripted_falls_back_to_the_echo_continuation() -> None:
    engine = ScriptedEngine(ENC, ["m"], script())
    echoed, _ = await run(EchoEngine(ENC, ["m"]), PROMPT)
    continued, last = await run(engine, PROMPT, echoed[:9])
    assert echoed[:9] + continued == echoed and last.finish_reason == "stop"
    assert (await run(engine, PROMPT))[0] == encoded(ALPHA)  # still no turn taken
    # Matching neither a turn nor echo's answer: refused, as echo refuses it.
    with pytest.raises(EngineError, match="not this engine's completion"):
        engine.generate([*PROMPT, *echoed[:8], 0], Sampling(generated=9), "none")


# -- vLLM ---------------------------------------------------------------------------------------

#: Keeps a random model from ending on a stop token by chance.
NO_STOP = {RETURN: -100.0, CALL: -100.0}


async def _collect(chunks: AsyncIterator[EngineChunk]) -> list[EngineChunk]:
    return [chunk async for chunk in chunks]


@pytest.mark.vllm
async def test_vllm_counts_generated_tokens_in_the_context_and_max_tokens_as_new(
    vllm_engine: VllmEngine,
) -> None:
    """A continuation is a longer prompt: the generated tokens take context, not output budget."""
    sampling = Sampling(max_tokens=6, logit_bias=NO_STOP, stop_token_ids=STOPS)
    first = await _collect(vllm_engine.generate(PROMPT, sampling, "vllm-full"))
    generated = [t for c in first for t in c.token_ids]
    assert len(generated) == 6
    resumed = Sampling(max_tokens=3, logit_bias=NO_STOP, stop_token_ids=STOPS, generated=6)
    chunks = await _collect(vllm_engine.generate([*PROMPT, *generated], resumed, "vllm-cont"))
    assert sum(len(c.token_ids) for c in chunks) == 3 and chunks[-1].finish_reason == "length"
    # Filling the context with original prompt + generated tokens leaves room for no more.
    filler = [*PROMPT, *[1000] * (TINY_MAX_MODEL_LEN - len(PROMPT) - 6)]
    with pytest.raises(PromptTooLong) as full:
        vllm_engine.generate([*filler, *generated], Sampling(generated=6), "vllm-over")
    assert full.value.prompt_tokens == TINY_MAX_MODEL_LEN
