"""Decoder throughput: tokens per second through HarmonyDecoder + ResponseBuilder (+ SSE frames).

Usage: ``python -m bench.decoder [--tokens 20000] [--reps 5]``. Prints the median over ``reps``
of: the Harmony parser alone, parser + builder (events checked by the state machine), and the
whole per-token path up to SSE frames and stored payloads (what the service does per token);
then that whole path with log probabilities (``include: ["message.output_text.logprobs"]``) at
``top_logprobs`` 0, 5 and 20, the engine's numbers made up (what costs is turning them into
entries and JSON, not their values).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

from openai_harmony import Role, StreamableParser

from app.encoding import load_encoding
from app.logprobs import token_texts
from domain.builder import ResponseBuilder, Usage
from domain.decoder import HarmonyDecoder
from domain.projections import payload_json, sse_frame


def _completion(n_words: int) -> str:
    words = " ".join(f"word{i % 97}" for i in range(n_words))
    return (
        f"<|channel|>analysis<|message|>{words}<|end|>"
        f"<|start|>assistant<|channel|>final<|message|>{words}<|return|>"
    )


def _builder() -> ResponseBuilder:
    counter = itertools.count()
    skeleton = {
        "id": "resp_bench",
        "object": "response",
        "created_at": 0,
        "model": "m",
        "tools": [],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
    }
    b = ResponseBuilder(skeleton, new_id=lambda p: f"{p}_{next(counter)}")
    b.created()
    b.in_progress()
    return b


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=20000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    enc = load_encoding()
    tokens = enc.encode(_completion(args.tokens // 4), allowed_special="all")
    n = len(tokens)

    made_up = {
        k: [(-0.5, [((t + i) % 199_000, -1.0 - i) for i in range(k)]) for t in tokens]
        for k in (0, 5, 20)
    }

    def parser_only() -> None:
        p = StreamableParser(enc, Role.ASSISTANT)
        for t in tokens:
            p.process(t)
            _ = p.last_content_delta

    def decode(frames: bool, k: int | None = None) -> None:
        b = _builder()
        d = HarmonyDecoder(enc, b, logprobs=None if k is None else token_texts(enc))
        engine_logprobs = made_up[k] if k is not None else []
        for i, t in enumerate(tokens):
            if k is None:
                d.feed((t,))
            else:
                d.feed_logprobs((t,), engine_logprobs[i : i + 1])
            events = b.take()
            if frames:
                for e in events:
                    sse_frame(e.type, e.sequence_number, payload_json(e))
        d.finish(truncated=False)
        b.finish("completed", usage=Usage(), completed_at=0)

    cases = {
        "harmony parser alone": parser_only,
        "decoder + builder + state machine": lambda: decode(False),
        "... + payload JSON + SSE frame": lambda: decode(True),
        "... with logprobs, top_logprobs 0": lambda: decode(True, 0),
        "... with logprobs, top_logprobs 5": lambda: decode(True, 5),
        "... with logprobs, top_logprobs 20": lambda: decode(True, 20),
    }
    print(f"{n} tokens per run, median of {args.reps} runs")
    print("| path | tokens/s | µs/token |\n|---|---:|---:|")
    for name, fn in cases.items():
        times = []
        for _ in range(args.reps):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        t = statistics.median(times)
        print(f"| {name} | {n / t:,.0f} | {t / n * 1e6:.2f} |")


if __name__ == "__main__":
    main()
