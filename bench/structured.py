"""What structured outputs cost: time to first token and per-token time, constrained vs not.

Both sides send the same prompt to :class:`app.engines.vllm.VllmEngine` in this process (the
pipeline's engine, before Harmony decoding, the log or HTTP): a forced call of one function
(``tool_choice`` names it, so the prompt ends inside the call's message). ``free``: the function is
not strict, its arguments are unconstrained. ``schema``: it is strict, its arguments held by the
turn grammar (:mod:`app.constraints`, vLLM's ``guidance`` backend) to an array of short strings,
which never has to end. The stop ids are biased away, so every stream runs to ``--tokens``.
``grammar``: a custom tool's Lark grammar (a list of SQL-like statements), same shape.

Reported per cell: TTFT p50/p90 (generate() to the first token; it includes compiling the grammar,
which llguidance does lazily), per-token p50 (each stream's time from its first to its last token
over its tokens - 1), and output tokens/s over the wall time. Each cell runs ``--reps`` times;
figures are of all its streams.

    python -m bench.structured                       # CPU, tiny model, C=1,8
    python -m bench.structured --kind 20b --no-enforce-eager --kv-cache-memory-bytes 0 \\
        --concurrency 1,16,64 --tokens 256           # a GPU
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.engines.vllm import HARMONY_STOP_TOKEN_IDS, parse_bytes

NO_STOP_BIAS = dict.fromkeys(HARMONY_STOP_TOKEN_IDS, -100.0)
NOTES = {
    "type": "object",
    "properties": {"notes": {"type": "array", "items": {"type": "string", "maxLength": 16}}},
    "required": ["notes"],
    "additionalProperties": False,
}
STATEMENTS = r"""
start: statement+
statement: "SELECT " column " FROM " table ";\n"
column: "id" | "name" | "email" | "total"
table: "users" | "orders" | /[a-z]{1,8}/
"""


@dataclass
class Cell:
    mode: str
    concurrency: int
    ttft_p50_ms: float
    ttft_p90_ms: float
    per_token_p50_ms: float
    tokens_per_s: float


def _request(mode: str) -> tuple[list[int], str | None]:
    from app.constraints import grammar_for
    from app.encoding import load_encoding
    from domain.prompt import PromptRequest, render_prompt

    if mode == "grammar":
        tool: dict[str, Any] = {
            "type": "custom",
            "name": "run_sql",
            "format": {"type": "grammar", "syntax": "lark", "definition": STATEMENTS},
        }
        choice: dict[str, Any] = {"type": "custom", "name": "run_sql"}
    else:
        tool = {
            "type": "function",
            "name": "take_notes",
            "parameters": NOTES,
            "strict": mode == "schema",
        }
        choice = {"type": "function", "name": "take_notes"}
    rendered = render_prompt(
        load_encoding(),
        PromptRequest(items="Take notes on the meeting.", tools=[tool], tool_choice=choice),
    )
    return rendered.token_ids, grammar_for(None, rendered, constrains=True)


async def _stream(
    engine: Any, prompt: list[int], sampling: Any, request_id: str
) -> tuple[float, float, int]:
    start = time.perf_counter()
    first = last = 0.0
    count = 0
    async for chunk in engine.generate(prompt, sampling, request_id):
        if chunk.token_ids:
            now = time.perf_counter()
            if count == 0:
                first = now
            last = now
            count += len(chunk.token_ids)
    return first - start, (last - first) / max(count - 1, 1), count


async def _cell(engine: Any, mode: str, concurrency: int, tokens: int, reps: int) -> Cell:
    from app.engines.protocol import Sampling

    prompt, grammar = _request(mode)
    assert (grammar is None) == (mode == "free")
    sampling = Sampling(max_tokens=tokens, logit_bias=dict(NO_STOP_BIAS), grammar=grammar, seed=1)
    ttfts: list[float] = []
    per_token: list[float] = []
    produced = 0
    wall = 0.0
    for rep in range(reps):
        began = time.perf_counter()
        results = await asyncio.gather(
            *(
                _stream(engine, prompt, sampling, f"{mode}-{concurrency}-{rep}-{i}")
                for i in range(concurrency)
            )
        )
        wall += time.perf_counter() - began
        for ttft, step, count in results:
            ttfts.append(ttft)
            per_token.append(step)
            produced += count
    ttfts.sort()
    return Cell(
        mode,
        concurrency,
        1000 * statistics.median(ttfts),
        1000 * ttfts[min(len(ttfts) - 1, int(0.9 * len(ttfts)))],
        1000 * statistics.median(per_token),
        produced / wall,
    )


async def _main(args: argparse.Namespace, workdir: Path) -> list[Cell]:
    from app.engines.tiny_model import write_gpt_oss_20b_config, write_tiny_config
    from app.engines.vllm import VllmEngine, VllmEngineConfig

    model_dir = workdir / f"gpt-oss-{args.kind}"
    if args.kind == "tiny":
        write_tiny_config(model_dir, max_position_embeddings=args.max_model_len)
    else:
        write_gpt_oss_20b_config(model_dir, mxfp4=args.kind == "20b-mxfp4")
    engine = VllmEngine(
        VllmEngineConfig(
            model=str(model_dir),
            served_model_names=("bench",),
            max_model_len=args.max_model_len,
            kv_cache_memory_bytes=args.kv_cache_memory_bytes or None,
            dtype="bfloat16",
            enforce_eager=args.enforce_eager,
            load_format="dummy",
        )
    )
    await engine.start()
    cells = []
    try:
        for mode in (
            "free",
            "free",
            "schema",
            "grammar",
        ):  # the first free cell warms the engine up
            for concurrency in args.concurrency:
                cell = await _cell(engine, mode, concurrency, args.tokens, args.reps)
                cells.append(cell)
        cells = cells[len(args.concurrency) :]
    finally:
        await engine.stop()
    return cells


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kind", choices=("tiny", "20b", "20b-mxfp4"), default="tiny")
    parser.add_argument(
        "--concurrency", type=lambda t: [int(x) for x in t.split(",")], default=[1, 8]
    )
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--kv-cache-memory-bytes", type=parse_bytes, default=parse_bytes("64M"))
    parser.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench-structured-"))
    os.environ.setdefault("VLLM_CACHE_ROOT", str(workdir / "vllm-cache"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(workdir / "inductor-cache"))
    os.environ["TMPDIR"] = str(workdir)
    cells = asyncio.run(_main(args, workdir))
    print(
        f"{'mode':8} {'C':>3} {'TTFT p50 ms':>12} {'TTFT p90 ms':>12} {'per-token p50 ms':>17} {'tok/s':>8}"
    )
    for c in cells:
        print(
            f"{c.mode:8} {c.concurrency:>3} {c.ttft_p50_ms:>12.1f} {c.ttft_p90_ms:>12.1f} "
            f"{c.per_token_p50_ms:>17.2f} {c.tokens_per_s:>8.1f}"
        )
    return 0


if __name__ == "__main__":  # vLLM's CPU platform spawns processes
    raise SystemExit(main())
