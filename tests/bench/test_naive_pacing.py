"""The paced naive peer spends the engine steps the ledger's scripted engine spends."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from app.encoding import load_encoding
from app.engines.echo import StepClock
from bench.naive import FRAMING_STEPS, _events
from bench.targets import ledger_script


class _Steps(StepClock):
    """A clock that records, at each step, how many delta frames the stream had produced."""

    def __init__(self, frames: list[bytes]) -> None:
        super().__init__(0.001)
        self.frames = frames
        self.deltas_at_step: list[int] = []

    def step(self) -> asyncio.Future[None]:
        self.deltas_at_step.append(sum(b".delta" in f for f in self.frames))
        return super().step()


async def test_a_paced_stream_waits_for_the_harmony_framing_steps_around_its_text(
    tmp_path: Path,
) -> None:
    frames: list[bytes] = []
    clock = _Steps(frames)
    async for frame in _events(5, "m", 1, None, clock):
        frames.append(frame)
    before, after = FRAMING_STEPS
    # three steps before the first delta, one before each delta, one after the last
    assert clock.deltas_at_step == [0] * before + [0, 1, 2, 3, 4] + [5] * after
    assert frames[-1].startswith(b"event: response.completed")
    # as many as the ledger's script has tokens around its text, which no delta carries
    script = json.loads(Path(ledger_script(tmp_path, 5)["script"]).read_text())
    head, text, tail = script["turns"][0]["completion"].partition(" word" * 5)
    encoding = load_encoding()
    assert text and (head, tail) == ("<|channel|>final<|message|>", "<|return|>")
    framing = [len(encoding.encode(part, allowed_special="all")) for part in (head, tail)]
    assert tuple(framing) == FRAMING_STEPS
