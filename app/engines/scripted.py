"""The scripted engine: plays raw Harmony completions from a JSON file, token by token.

``{"turns": [{"completion": "<raw Harmony text>"}, ...], "token_delay_ms": 0}``. Each ``generate``
call takes the next turn, encodes it with the real ``o200k_harmony`` encoding (special tokens
allowed) and streams it one token at a time; when the turns run out it behaves like echo. The raw
text is what a model writes after ``<|start|>assistant``, e.g.
``<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>Hi<|return|>``.

With ``"cycle": true`` the turns repeat forever instead of running out (the benchmark uses it).

A turn may also set ``"token_delay_ms"`` (overrides the file's) and ``"error"`` (after its tokens
the engine fails with that message: how tests reach the ``response.failed`` path). Tests and the
benchmark also pass the script as a dict.

A continuation (``Sampling.generated``: another server's replica died mid-response and this one
resumes it from the log) takes no turn: it resumes the first turn in the script, used or not,
whose tokens begin with the generated ones, with that turn's delay and error, so a takeover test
sees the same completion go on at the right token whatever the turn counter says. When no turn
matches it continues as echo does (which refuses generated tokens that are not echo's answer).

The latest prompts (``PROMPTS_KEPT`` of them, so a long-running server does not grow by one
prompt per request) are kept in :attr:`ScriptedEngine.prompts`, so tests can compare prompt token
ids; :attr:`ScriptedEngine.prompt_count` counts them all.

For the benchmark's latency figures, with ``BENCH_TOKEN_TIMES_DIR`` set the engine appends, for
each request, a record to ``<dir>/<pid>.times``: the request id and the ``time.monotonic_ns()``
at which it yielded each output token, as little-endian int64s, written before the final chunk
(``bench.token_times``). The service uses the response id as the engine request id, so the
record is the response's.
"""

from __future__ import annotations

import collections
import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from openai_harmony import HarmonyEncoding

from app.engines.echo import EchoEngine

__all__ = ["PROMPTS_KEPT", "ScriptedEngine", "load_script"]

#: How many of the latest prompts the engine keeps for inspection.
PROMPTS_KEPT = 64


def load_script(path: str | Path) -> dict[str, Any]:
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or not isinstance(data.get("turns", []), list):
        raise ValueError(f"{path}: expected an object with a 'turns' list")
    return data


class ScriptedEngine(EchoEngine):
    def __init__(
        self, encoding: HarmonyEncoding, model_names: Sequence[str], script: dict[str, Any]
    ) -> None:
        super().__init__(encoding, model_names)
        self._turns: list[dict[str, Any]] = list(script.get("turns", []))
        self._delay_ms = float(script.get("token_delay_ms", 0))
        self._cycle = bool(script.get("cycle", False))
        self._lock = threading.Lock()
        self._next = 0
        self.prompts: collections.deque[list[int]] = collections.deque(maxlen=PROMPTS_KEPT)
        self.prompt_count = 0
        times_dir = os.environ.get("BENCH_TOKEN_TIMES_DIR")
        self.token_times_dir = Path(times_dir) if times_dir else None

    def add_turns(self, *turns: dict[str, Any]) -> None:
        with self._lock:
            self._turns.extend(turns)

    def completion_for(self, prompt_token_ids: Sequence[int]) -> tuple[str, float, str | None]:
        with self._lock:
            self.prompts.append(list(prompt_token_ids))
            self.prompt_count += 1
            if self._cycle and self._turns:
                self._next %= len(self._turns)
            turn = self._turns[self._next] if self._next < len(self._turns) else None
            if turn is not None:
                self._next += 1
        if turn is None:
            return super().completion_for(prompt_token_ids)
        return self._played(turn)

    def continuation_for(
        self, prompt_token_ids: Sequence[int], generated: int
    ) -> tuple[str, float, str | None]:
        with self._lock:
            self.prompts.append(list(prompt_token_ids))
            self.prompt_count += 1
            turns = list(self._turns)
        tail = list(prompt_token_ids[len(prompt_token_ids) - generated :])
        for turn in turns:
            if self._tokens(str(turn["completion"]))[:generated] == tail:
                return self._played(turn)
        return super().continuation_for(prompt_token_ids, generated)

    def _played(self, turn: dict[str, Any]) -> tuple[str, float, str | None]:
        delay_ms = float(turn.get("token_delay_ms", self._delay_ms))
        return str(turn["completion"]), delay_ms / 1000.0, turn.get("error")
