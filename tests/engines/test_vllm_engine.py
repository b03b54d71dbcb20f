"""VllmEngine against vLLM's CPU build on a tiny random-weight gpt-oss.

Random weights write random tokens, so these tests check the pipeline (ids in, ids out, stop,
length, abort, errors, usage), never the words. ``logit_bias`` makes the outcome certain where it
matters: +100 on a token forces it, -100 on the stop tokens keeps a generation going.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from app.encoding import load_encoding
from app.engines.protocol import EngineChunk, EngineError, PromptTooLong, PushedChunks, Sampling
from app.engines.tiny_model import write_gpt_oss_20b_config, write_tiny_config
from app.engines.vllm import (
    HARMONY_STOP_TOKEN_IDS,
    VllmEngine,
    VllmEngineConfig,
    add_engine_arguments,
    engine_config_from,
)
from tests.engines.conftest import TINY_MAX_MODEL_LEN, tiny_engine_config

RETURN, CALL, START, END, MESSAGE, CHANNEL = 200002, 200012, 200006, 200007, 200008, 200005
HARMONY_STOPS = (RETURN, CALL)
#: Keeps a random model from ending on a stop token by chance.
NO_STOP = {RETURN: -100.0, CALL: -100.0}
vllm = pytest.mark.vllm

_counter = 0


def request_id(name: str) -> str:
    global _counter
    _counter += 1
    return f"{name}-{_counter}"


def prompt(length: int, offset: int = 0) -> list[int]:
    """A Harmony-looking prompt of ``length`` ids (ordinary text ids after the header)."""
    head = [START, 1428, MESSAGE]  # <|start|>user<|message|>
    body = [(1000 + offset + 7 * i) % 150000 for i in range(max(0, length - len(head)))]
    return (head + body)[:length]


async def collect(chunks: AsyncIterator[EngineChunk]) -> list[EngineChunk]:
    return [chunk async for chunk in chunks]


def tokens(chunks: Sequence[EngineChunk]) -> list[int]:
    return [token for chunk in chunks for token in chunk.token_ids]


def check_one_final(chunks: Sequence[EngineChunk]) -> EngineChunk:
    """Exactly the last chunk carries a finish reason."""
    assert chunks, "the generation yielded nothing"
    assert all(chunk.finish_reason is None for chunk in chunks[:-1])
    assert chunks[-1].finish_reason is not None
    return chunks[-1]


# -- configuration (no vLLM needed) ---------------------------------------------------------------


def test_harmony_stop_ids_are_return_and_call() -> None:
    encoding = load_encoding()
    assert set(HARMONY_STOP_TOKEN_IDS) == set(encoding.stop_tokens_for_assistant_actions())
    assert encoding.encode("<|return|><|call|>", allowed_special="all") == [RETURN, CALL]


def test_config_from_environment() -> None:
    config = engine_config_from(
        environ={
            "RESPONSES_LEDGER_MODEL": "/models/gpt-oss-20b",
            "RESPONSES_LEDGER_SERVED_MODEL_NAME": "gpt-oss-20b, openai/gpt-oss-20b",
            "RESPONSES_LEDGER_VLLM_TENSOR_PARALLEL_SIZE": "2",
            "RESPONSES_LEDGER_VLLM_DATA_PARALLEL_SIZE": "4",
            "RESPONSES_LEDGER_VLLM_MAX_MODEL_LEN": "32768",
            "RESPONSES_LEDGER_VLLM_GPU_MEMORY_UTILIZATION": "0.85",
            "RESPONSES_LEDGER_VLLM_KV_CACHE_MEMORY_BYTES": "1.5GiB",
            "RESPONSES_LEDGER_VLLM_DTYPE": "bfloat16",
            "RESPONSES_LEDGER_VLLM_ENFORCE_EAGER": "true",
            "RESPONSES_LEDGER_VLLM_SEED": "7",
            "RESPONSES_LEDGER_VLLM_LOAD_FORMAT": "dummy",
            "RESPONSES_LEDGER_VLLM_ENGINE_ARGS": '{"max_num_seqs": 64}',
        }
    )
    assert config == VllmEngineConfig(
        model="/models/gpt-oss-20b",
        served_model_names=("gpt-oss-20b", "openai/gpt-oss-20b"),
        tensor_parallel_size=2,
        data_parallel_size=4,
        max_model_len=32768,
        gpu_memory_utilization=0.85,
        kv_cache_memory_bytes=3 << 29,
        dtype="bfloat16",
        enforce_eager=True,
        seed=7,
        load_format="dummy",
        extra_engine_args={"max_num_seqs": 64},
    )
    args = config.engine_args()
    assert args["skip_tokenizer_init"] is True  # no tokenizer.json there: no structured outputs
    assert "structured_outputs_config" not in args and not VllmEngine(config).constrains
    assert args["served_model_name"] == ["gpt-oss-20b", "openai/gpt-oss-20b"]
    assert args["kv_cache_memory_bytes"] == 3 << 29
    assert args["max_num_seqs"] == 64


def test_config_arguments_win_over_environment() -> None:
    parser = add_engine_arguments(argparse.ArgumentParser())
    args = parser.parse_args(
        [
            *("--model", "/m", "--served-model-name", "a", "--served-model-name", "b,c"),
            *("--no-enforce-eager", "--kv-cache-memory-bytes", "512M", "--max-model-len", "2048"),
        ]
    )
    environ = {
        "RESPONSES_LEDGER_MODEL": "/env",
        "RESPONSES_LEDGER_VLLM_ENFORCE_EAGER": "1",
        "RESPONSES_LEDGER_VLLM_SEED": "3",
    }
    config = engine_config_from(args, environ)
    assert config.model == "/m"
    assert config.model_names == ("a", "b", "c")
    assert config.enforce_eager is False
    assert config.kv_cache_memory_bytes == 512 << 20
    assert config.max_model_len == 2048
    assert config.seed == 3  # not on the command line: from the environment
    assert engine_config_from(args, environ, seed=11, model="/o").seed == 11


def test_config_defaults_and_errors() -> None:
    config = engine_config_from(environ={"RESPONSES_LEDGER_MODEL": "/m"})
    assert config.model_names == ("/m",)
    args = config.engine_args()
    assert "max_model_len" not in args and "kv_cache_memory_bytes" not in args
    assert (args["tensor_parallel_size"], args["seed"], args["load_format"]) == (1, 0, "auto")
    with pytest.raises(ValueError, match="RESPONSES_LEDGER_MODEL"):
        engine_config_from(environ={})
    with pytest.raises(ValueError, match="RESPONSES_LEDGER_VLLM_SEED"):
        engine_config_from(
            environ={"RESPONSES_LEDGER_MODEL": "/m", "RESPONSES_LEDGER_VLLM_SEED": "x"}
        )
    with pytest.raises(ValueError, match="JSON object"):
        engine_config_from(
            environ={"RESPONSES_LEDGER_MODEL": "/m", "RESPONSES_LEDGER_VLLM_ENGINE_ARGS": "[1]"}
        )
    named = VllmEngineConfig(model="/m", tokenizer="/tok").engine_args()
    assert (named["skip_tokenizer_init"], named["tokenizer"]) == (False, "/tok")
    assert named["structured_outputs_config"] == {"backend": "guidance"}
    with pytest.raises(TypeError, match="colour"):
        engine_config_from(environ={"RESPONSES_LEDGER_MODEL": "/m"}, colour="red")


def test_a_model_directory_with_a_tokenizer_constrains(tmp_path: Path) -> None:
    """The tiny model's directory gets the o200k_harmony tokenizer, so vLLM loads it."""
    directory = write_tiny_config(tmp_path / "tiny")
    config = VllmEngineConfig(model=str(directory))
    args = config.engine_args()
    assert (args["skip_tokenizer_init"], args["tokenizer"]) == (False, str(directory))
    assert VllmEngine(config).constrains


async def test_generate_before_start_refuses() -> None:
    engine = VllmEngine(VllmEngineConfig(model="/nowhere"))
    assert not engine.healthy()
    with pytest.raises(EngineError, match="not started"):
        engine.generate([1, 2, 3], Sampling(max_tokens=1), "early")


@vllm
@pytest.mark.parametrize("mxfp4", [False, True], ids=["bf16", "mxfp4"])
def test_gpt_oss_20b_config_is_what_vllm_reads(vllm_scratch: Path, mxfp4: bool) -> None:
    """The GPU benchmark's model: vLLM resolves it as gpt-oss-20b without loading anything."""
    from vllm.engine.arg_utils import EngineArgs

    directory = write_gpt_oss_20b_config(vllm_scratch / f"gpt-oss-20b-{mxfp4}", mxfp4=mxfp4)
    model = EngineArgs(
        model=str(directory), skip_tokenizer_init=True, load_format="dummy", max_model_len=8192
    ).create_model_config()
    hf = model.hf_config
    assert model.architectures == ["GptOssForCausalLM"]
    assert model.get_vocab_size() == 201088
    assert (hf.num_hidden_layers, hf.hidden_size, hf.head_dim) == (24, 2880, 64)
    assert (hf.num_attention_heads, hf.num_key_value_heads) == (64, 8)
    assert (hf.num_local_experts, hf.num_experts_per_tok) == (32, 4)
    assert hf.layer_types == ["sliding_attention", "full_attention"] * 12
    assert model.get_sliding_window() == 128
    rope = hf.rope_parameters
    assert (rope["rope_type"], rope["factor"], rope["rope_theta"]) == ("yarn", 32.0, 150000)
    assert rope["original_max_position_embeddings"] == 4096
    assert (model.quantization is not None) == mxfp4


# -- the engine ----------------------------------------------------------------------------------


@vllm
async def test_engine_reports_the_model(vllm_engine: VllmEngine) -> None:
    assert vllm_engine.healthy()
    assert vllm_engine.model_names == ("gpt-oss-tiny",)
    assert vllm_engine.vocab_size == 201088
    assert vllm_engine.max_model_len == TINY_MAX_MODEL_LEN


@vllm
async def test_prompt_ids_reach_the_engine_and_ids_stream_back(vllm_engine: VllmEngine) -> None:
    """Greedy decoding is a function of the prompt: equal prompts give equal ids, different prompts
    (almost always) different ones, so the prompt is what the model saw."""
    greedy = Sampling(max_tokens=4, temperature=0.0, logit_bias=NO_STOP)
    outputs = []
    for offset in (0, 0, 1, 2, 3):
        chunks = await collect(vllm_engine.generate(prompt(16, offset), greedy, request_id("ids")))
        final = check_one_final(chunks)
        assert final.finish_reason == "length"
        ids = tokens(chunks)
        assert len(ids) == 4
        assert all(type(t) is int and 0 <= t < vllm_engine.vocab_size for t in ids)
        outputs.append(tuple(ids))
    assert outputs[0] == outputs[1]
    assert len(set(outputs[1:])) > 1, outputs


@vllm
async def test_tokens_stream_one_chunk_per_step(vllm_engine: VllmEngine) -> None:
    chunks = await collect(
        vllm_engine.generate(prompt(8), Sampling(max_tokens=5, seed=3, logit_bias=NO_STOP), "s1")
    )
    assert [len(chunk.token_ids) for chunk in chunks] == [1, 1, 1, 1, 1]


@vllm
@pytest.mark.parametrize("stop", [RETURN, CALL])
async def test_harmony_stop_tokens_end_the_generation(vllm_engine: VllmEngine, stop: int) -> None:
    # No stop ids from the caller: the engine always adds <|return|> and <|call|>.
    sampling = Sampling(max_tokens=20, logit_bias={stop: 100.0})
    chunks = await collect(vllm_engine.generate(prompt(10), sampling, request_id("stop")))
    final = check_one_final(chunks)
    assert final.finish_reason == "stop"
    assert tokens(chunks) == [stop]


@vllm
async def test_caller_stop_tokens_end_the_generation(vllm_engine: VllmEngine) -> None:
    sampling = Sampling(
        max_tokens=20, stop_token_ids=(*HARMONY_STOPS, END), logit_bias={END: 100.0}
    )
    chunks = await collect(vllm_engine.generate(prompt(10), sampling, request_id("end")))
    assert check_one_final(chunks).finish_reason == "stop"
    assert tokens(chunks) == [END]
    # Without END among the stop ids the same bias just writes END until max_tokens.
    sampling = Sampling(max_tokens=3, stop_token_ids=HARMONY_STOPS, logit_bias={END: 100.0})
    chunks = await collect(vllm_engine.generate(prompt(10), sampling, request_id("end")))
    assert check_one_final(chunks).finish_reason == "length"
    assert tokens(chunks) == [END, END, END]


@vllm
async def test_max_tokens_gives_length_with_exactly_that_many(vllm_engine: VllmEngine) -> None:
    sampling = Sampling(max_tokens=6, temperature=1.0, top_p=0.9, seed=1, logit_bias=NO_STOP)
    chunks = await collect(vllm_engine.generate(prompt(12), sampling, request_id("len")))
    assert check_one_final(chunks).finish_reason == "length"
    assert len(tokens(chunks)) == 6


@vllm
async def test_seed_makes_sampling_repeatable(vllm_engine: VllmEngine) -> None:
    runs = []
    for seed in (5, 5, 6):
        sampling = Sampling(max_tokens=4, temperature=1.0, seed=seed, logit_bias=NO_STOP)
        runs.append(
            tokens(
                await collect(
                    vllm_engine.generate(prompt(12), sampling, f"seed-{seed}-{len(runs)}")
                )
            )
        )
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


@vllm
async def test_penalties_reach_vllm_and_change_what_it_samples(vllm_engine: VllmEngine) -> None:
    params = vllm_engine._sampling_params(Sampling(presence_penalty=1.5, frequency_penalty=-0.5), 4)
    assert (params.presence_penalty, params.frequency_penalty) == (1.5, -0.5)
    runs = {}
    for name, penalties in {
        "none": {},
        "presence": {"presence_penalty": 2.0},
        "frequency": {"frequency_penalty": 2.0},
    }.items():
        sampling = Sampling(max_tokens=24, temperature=0.0, logit_bias=NO_STOP, **penalties)
        chunks = await collect(
            vllm_engine.generate(prompt(12), sampling, request_id(f"penalty-{name}"))
        )
        runs[name] = tokens(chunks)
    # greedy decoding on the random weights repeats tokens; a penalty on them changes the pick
    assert len(set(runs["none"])) < len(runs["none"])
    assert runs["presence"] != runs["none"] and runs["frequency"] != runs["none"]


@vllm
async def test_max_tokens_none_uses_the_rest_of_the_context(vllm_engine: VllmEngine) -> None:
    long_prompt = prompt(TINY_MAX_MODEL_LEN - 2)
    chunks = await collect(
        vllm_engine.generate(long_prompt, Sampling(logit_bias=NO_STOP), request_id("rest"))
    )
    assert check_one_final(chunks).finish_reason == "length"
    assert len(tokens(chunks)) == 2


@vllm
async def test_prompt_too_long(vllm_engine: VllmEngine) -> None:
    limit = TINY_MAX_MODEL_LEN
    with pytest.raises(PromptTooLong) as alone:
        vllm_engine.generate(prompt(limit + 1), Sampling(max_tokens=1), "long")
    assert (alone.value.prompt_tokens, alone.value.max_model_len) == (limit + 1, limit)
    # The prompt fills the context exactly: no room for even one token.
    with pytest.raises(PromptTooLong):
        vllm_engine.generate(prompt(limit), Sampling(), "full")
    # The prompt fits but prompt + max_tokens does not: refused, not silently shortened.
    with pytest.raises(PromptTooLong) as with_output:
        vllm_engine.generate(prompt(limit - 10), Sampling(max_tokens=11), "over")
    assert with_output.value.max_tokens == 11
    # Exactly at the limit is fine.
    chunks = await collect(
        vllm_engine.generate(
            prompt(limit - 10), Sampling(max_tokens=10, logit_bias=NO_STOP), request_id("fits")
        )
    )
    assert len(tokens(chunks)) == 10
    assert vllm_engine.healthy()


@vllm
@pytest.mark.parametrize(
    "bad_prompt",
    [[START, 201088, MESSAGE], [START, -1], [START, 10**9], [START, 3.0], []],
    ids=["vocab-size", "negative", "huge", "float", "empty"],
)
async def test_bad_prompt_ids_are_refused_and_engine_survives(
    vllm_engine: VllmEngine, bad_prompt: list[int]
) -> None:
    with pytest.raises(EngineError) as refused:
        vllm_engine.generate(bad_prompt, Sampling(max_tokens=2), request_id("bad"))
    assert not isinstance(refused.value, PromptTooLong)
    assert "vocabulary" in str(refused.value) or "no tokens" in str(refused.value)
    assert vllm_engine.healthy()
    chunks = await collect(
        vllm_engine.generate(
            prompt(6), Sampling(max_tokens=2, logit_bias=NO_STOP), request_id("ok")
        )
    )
    assert check_one_final(chunks).finish_reason == "length"
    assert vllm_engine.healthy()


@vllm
async def test_bad_logit_bias_and_max_tokens_are_refused(vllm_engine: VllmEngine) -> None:
    with pytest.raises(EngineError, match="logit_bias token id 201088"):
        vllm_engine.generate(prompt(4), Sampling(max_tokens=2, logit_bias={201088: 1.0}), "b1")
    with pytest.raises(EngineError, match="stop token id -5"):
        vllm_engine.generate(prompt(4), Sampling(max_tokens=2, stop_token_ids=(-5,)), "b2")
    with pytest.raises(EngineError, match="max_tokens"):
        vllm_engine.generate(prompt(4), Sampling(max_tokens=0), "b3")
    assert vllm_engine.healthy()


async def wait_until_idle(engine: VllmEngine, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while engine.num_unfinished_requests:
        assert time.monotonic() < deadline, "vLLM still holds the request"
        await asyncio.sleep(0.02)


LONG = Sampling(max_tokens=3000, logit_bias=NO_STOP)


@vllm
async def test_abort_ends_the_generation_and_frees_the_request(vllm_engine: VllmEngine) -> None:
    rid = request_id("abort")
    stream = vllm_engine.generate(prompt(8), LONG, rid)
    first = await anext(stream)
    assert first.finish_reason is None and len(first.token_ids) == 1
    await vllm_engine.abort(rid)
    rest = await asyncio.wait_for(collect(stream), timeout=10)
    final = check_one_final([first, *rest])
    assert final.finish_reason == "abort"
    assert len(tokens([first, *rest])) < 3000
    await wait_until_idle(vllm_engine)
    chunks = await collect(
        vllm_engine.generate(
            prompt(8), Sampling(max_tokens=2, logit_bias=NO_STOP), request_id("after")
        )
    )
    assert check_one_final(chunks).finish_reason == "length"


@vllm
async def test_consumer_going_away_aborts(vllm_engine: VllmEngine) -> None:
    stream = vllm_engine.generate(prompt(8), LONG, request_id("gone"))
    await anext(stream)
    assert vllm_engine.num_unfinished_requests == 1
    await stream.aclose()  # what `async for ... break` and a dropped client lead to
    await wait_until_idle(vllm_engine)


@vllm
async def test_cancelled_consumer_aborts(vllm_engine: VllmEngine) -> None:
    started = asyncio.Event()

    async def consume() -> None:
        async for _chunk in vllm_engine.generate(prompt(8), LONG, request_id("cancel")):
            started.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(started.wait(), timeout=10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_until_idle(vllm_engine)


@vllm
async def test_repeated_prompt_reports_cached_tokens(vllm_engine: VllmEngine) -> None:
    # The CPU build caches whole blocks of 128 tokens; 300 tokens fill two of them.
    shared = prompt(300, offset=42)
    sampling = Sampling(max_tokens=2, logit_bias=NO_STOP)
    first = await collect(vllm_engine.generate(shared, sampling, request_id("cache")))
    second = await collect(vllm_engine.generate(shared, sampling, request_id("cache")))
    assert first[-1].num_cached_tokens == 0
    cached = second[-1].num_cached_tokens
    assert cached is not None and 128 <= cached < 300
    assert cached % 128 == 0


@vllm
async def test_concurrent_requests_all_complete(vllm_engine: VllmEngine) -> None:
    async def one(i: int) -> list[EngineChunk]:
        sampling = Sampling(max_tokens=4 + i, seed=i, logit_bias=NO_STOP)
        return await collect(vllm_engine.generate(prompt(10 + i, i), sampling, f"conc-{i}"))

    results = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(6))), timeout=60)
    for i, chunks in enumerate(results):
        assert check_one_final(chunks).finish_reason == "length"
        assert len(tokens(chunks)) == 4 + i
    await wait_until_idle(vllm_engine)


# -- a dying engine (its own engine: the shared one must survive) ---------------------------------


@vllm
@pytest.mark.slow
async def test_dead_engine_core_ends_streams_with_error(vllm_scratch: Path) -> None:
    psutil = pytest.importorskip("psutil")
    me = psutil.Process()
    before = {child.pid for child in me.children()}
    # no Prometheus logger: vLLM's would replace the shared engine's vllm:* metrics in the
    # process's one registry (tests/engines/test_vllm_metrics.py reads them after this test)
    engine = VllmEngine(
        tiny_engine_config(
            vllm_scratch / "doomed", served_model_names=("doomed",), prometheus=False
        )
    )
    await engine.start()
    try:
        stream = engine.generate(prompt(8), LONG, "doomed-1")
        await anext(stream)
        # and one pushed from vLLM's output handler (``PushedChunks``), as the service takes them
        pushing = engine.generate(prompt(8), LONG, "doomed-pushed")
        assert isinstance(pushing, PushedChunks)
        pushed: list[EngineChunk] = []
        pushed_done = pushing.push_to(pushed.append)  # type: ignore[arg-type]
        while not pushed:
            await asyncio.sleep(0.01)
        cores = [c for c in me.children() if c.pid not in before and "EngineCore" in c.name()]
        assert cores, [c.name() for c in me.children()]
        for core in cores:
            core.kill()
        rest = await asyncio.wait_for(collect(stream), timeout=30)
        final = check_one_final(rest)
        assert final.finish_reason == "error"
        assert final.error and "died" in final.error
        await asyncio.wait_for(pushed_done, timeout=30)
        final = check_one_final(pushed)
        assert final.finish_reason == "error" and final.error and "died" in final.error
        assert not engine.healthy()
        # A new request on the dead engine ends at once, with an error, instead of hanging.
        chunks = await asyncio.wait_for(
            collect(engine.generate(prompt(8), Sampling(max_tokens=2), "doomed-2")), timeout=10
        )
        assert [c.finish_reason for c in chunks] == ["error"]
    finally:
        await engine.stop()
