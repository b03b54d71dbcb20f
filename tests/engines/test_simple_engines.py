"""The echo and scripted engines: the engine contract without a model."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from app.encoding import load_encoding
from app.engines.echo import EchoEngine
from app.engines.protocol import EngineChunk, Sampling
from app.engines.scripted import PROMPTS_KEPT, ScriptedEngine

ENC = load_encoding()
STOPS = (200002, 200012)
COMPLETION = "<|channel|>final<|message|>one two three four<|return|>"


async def _collect(
    engine: EchoEngine, sampling: Sampling, request_id: str = "r1"
) -> list[EngineChunk]:
    return [chunk async for chunk in engine.generate([200006], sampling, request_id)]


async def test_scripted_streams_its_turn_token_by_token_and_stops_on_the_stop_token() -> None:
    engine = ScriptedEngine(ENC, ["m"], {"turns": [{"completion": COMPLETION}]})
    chunks = await _collect(engine, Sampling(stop_token_ids=STOPS))
    tokens = [t for c in chunks for t in c.token_ids]
    assert tokens == ENC.encode(COMPLETION, allowed_special="all")
    assert [c.finish_reason for c in chunks][-1] == "stop" and chunks[-1].token_ids == (200002,)


async def test_max_tokens_ends_with_length() -> None:
    engine = ScriptedEngine(ENC, ["m"], {"turns": [{"completion": COMPLETION}]})
    chunks = await _collect(engine, Sampling(max_tokens=3, stop_token_ids=STOPS))
    assert sum(len(c.token_ids) for c in chunks) == 3 and chunks[-1].finish_reason == "length"


async def test_an_error_turn_ends_with_error() -> None:
    engine = ScriptedEngine(
        ENC, ["m"], {"turns": [{"completion": "<|channel|>final<|message|>x", "error": "boom"}]}
    )
    chunks = await _collect(engine, Sampling(stop_token_ids=STOPS))
    assert (chunks[-1].finish_reason, chunks[-1].error) == ("error", "boom")


async def test_abort_ends_the_stream() -> None:
    engine = ScriptedEngine(
        ENC, ["m"], {"turns": [{"completion": COMPLETION, "token_delay_ms": 20}]}
    )
    seen: list[EngineChunk] = []

    async def consume() -> None:
        async for chunk in engine.generate([200006], Sampling(stop_token_ids=STOPS), "r9"):
            seen.append(chunk)

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.05)
    await engine.abort("r9")
    await asyncio.wait_for(task, 5)
    assert seen[-1].finish_reason == "abort" and "r9" in engine.aborted_requests


async def test_turns_run_out_into_echo_and_cycle_repeats() -> None:
    engine = ScriptedEngine(ENC, ["m"], {"turns": [{"completion": COMPLETION}]})
    prompt = ENC.encode(
        "<|start|>user<|message|>hello<|end|><|start|>assistant", allowed_special="all"
    )
    await _collect(engine, Sampling(stop_token_ids=STOPS))
    chunks = [c async for c in engine.generate(prompt, Sampling(stop_token_ids=STOPS), "r2")]
    assert "hello<|return|>" in ENC.decode_utf8([t for c in chunks for t in c.token_ids])
    cycling = ScriptedEngine(ENC, ["m"], {"turns": [{"completion": COMPLETION}], "cycle": True})
    for _ in range(3):
        chunks = await _collect(cycling, Sampling(stop_token_ids=STOPS))
        assert ENC.decode_utf8([t for c in chunks for t in c.token_ids]) == COMPLETION


async def test_token_times_are_written_for_the_benchmark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BENCH_TOKEN_TIMES_DIR", str(tmp_path))
    engine = ScriptedEngine(ENC, ["m"], {"turns": [{"completion": COMPLETION}]})
    chunks = await _collect(engine, Sampling(stop_token_ids=STOPS), "resp_x")
    from bench import token_times

    times = token_times.read_all(tmp_path)["resp_x"]
    assert len(times) == sum(len(c.token_ids) for c in chunks)
    assert list(times) == sorted(times)


async def test_paced_streams_share_steps_and_one_cancelled_stream_stops_no_other() -> None:
    from app.engines.echo import StepClock, stream_tokens

    class CountingClock(StepClock):
        def __init__(self, interval_s: float) -> None:
            super().__init__(interval_s)
            self.steps = 0

        def _tick(self) -> None:
            self.steps += 1
            super()._tick()

    clock = CountingClock(0.02)
    sampling = Sampling(max_tokens=None, stop_token_ids=STOPS)

    async def run(ids: list[int]) -> list[int]:
        got: list[int] = []
        async for chunk in stream_tokens(ids, sampling, aborted=asyncio.Event(), clock=clock):
            got.extend(chunk.token_ids)
        return got

    doomed = asyncio.ensure_future(run(list(range(100, 150))))
    survivors = [asyncio.ensure_future(run([1, 2, 3, 4, 5])) for _ in range(20)]
    await asyncio.sleep(0.03)
    doomed.cancel()  # while it waits on the step the others wait on too
    assert await asyncio.gather(*survivors) == [[1, 2, 3, 4, 5]] * 20
    with pytest.raises(asyncio.CancelledError):
        await doomed
    # 21 streams advanced together: a handful of steps, not one timer per stream per token
    assert 5 <= clock.steps <= 8, clock.steps


async def test_paced_steps_keep_their_grid_when_the_event_loop_comes_late() -> None:
    """An engine's steps do not wait for its frontend: a step the event loop came to late, or
    whose streams kept it busy, is followed by the next one on the grid, not one interval after
    the late one. A step no stream waited for stops the clock; the next stream to ask starts it
    again one interval away."""
    from app.engines.echo import StepClock

    loop = asyncio.get_running_loop()
    clock = StepClock(0.1)
    at: list[float] = []

    def step() -> None:
        at.append(loop.time())
        if len(at) == 1:
            time.sleep(0.06)  # the step's work keeps the loop for most of an interval
            loop.call_later(0.01, time.sleep, 0.09)  # and then the loop is busy when step 2 is due
        if len(at) < 4:
            clock.call_at_step(step)

    asked = loop.time()
    clock.call_at_step(step)
    await asyncio.sleep(0.6)
    assert len(at) == 4
    assert at[0] - asked >= 0.099
    assert at[1] - at[0] >= 0.14  # came late: the loop was busy when it was due
    assert 0.18 <= at[2] - at[0] <= 0.26  # back on the grid (a clock that waits an interval after
    assert 0.28 <= at[3] - at[0] <= 0.36  # each step's first stream: 0.3 and 0.4 after the first)
    again = loop.time()  # the clock stopped after a step nobody waited for
    clock.call_at_step(lambda: at.append(loop.time()))
    await asyncio.sleep(0.2)
    assert len(at) == 5 and at[4] - again >= 0.099


async def test_the_scripted_engine_keeps_only_the_latest_prompts() -> None:
    """A long-running scripted server must not grow by one prompt per request (issue 14)."""
    engine = ScriptedEngine(
        load_encoding(), ["m"], {"turns": [{"completion": "<|return|>"}], "cycle": True}
    )
    for n in range(PROMPTS_KEPT + 10):
        async for _ in engine.generate([n], Sampling(stop_token_ids=STOPS), f"r{n}"):
            pass
    assert engine.prompt_count == PROMPTS_KEPT + 10
    assert len(engine.prompts) == PROMPTS_KEPT and engine.prompts[-1] == [PROMPTS_KEPT + 9]
