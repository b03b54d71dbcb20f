"""vLLM's async engine (``AsyncLLM``) in the server's process: the production engine.

The engine is fed token ids and streams token ids. Harmony does all tokenising and detokenising:
every prompt goes in as ``TokensPrompt(prompt_token_ids=...)`` and every request asks for
``RequestOutputKind.DELTA`` with ``detokenize=False``; ``<|return|>`` and ``<|call|>`` are always
passed as ``stop_token_ids``.

Structured outputs (``Sampling.grammar``, see :mod:`app.constraints`) need vLLM to know what each
token id is, so when the model directory holds a ``tokenizer.json`` (a real gpt-oss has its own;
:mod:`app.engines.tiny_model` writes the o200k_harmony one built offline) or ``--tokenizer``
names one, vLLM loads it and decodes grammars with the ``guidance`` backend (llguidance, which
reads Lark grammars with Harmony's special tokens); the engine then ``constrains``. Without a
tokenizer vLLM starts with ``skip_tokenizer_init=True`` and a constrained request is refused.

Checks done here because vLLM does not do them (or does them badly) without a tokenizer:

- Every prompt token id must be in ``[0, vocab_size)``. vLLM only checks ids against a tokenizer;
  an out-of-range id reaches the embedding and kills the engine core for every request.
- ``prompt + max_tokens`` must fit the context. vLLM silently shortens the output when it does not,
  which the client would see as a truncated answer with no reason; here it is ``PromptTooLong``.
  ``max_tokens=None`` means "the rest of the context".

Log probabilities (``Sampling.logprobs = k``): vLLM is asked for ``logprobs=k`` in its flat
layout (``flat_logprobs=True``: a few lists per request instead of a dict per token), which holds
per position the sampled token first, then the top ``k`` by rank. They are vLLM's default
``raw_logprobs``: the model's distribution before temperature, top_p and logit_bias. Token ids
only (``detokenize=False``): the service turns them into text and bytes with Harmony.

When the engine core dies (``EngineDeadError``) each open generation ends with a chunk whose
``finish_reason`` is ``error``, and :meth:`VllmEngine.healthy` turns False; nothing hangs.

Configuration: :class:`VllmEngineConfig` is a frozen value built by :func:`engine_config_from`
from keyword overrides, then command-line arguments (see :func:`add_engine_arguments`), then
environment variables, then defaults:

=================================  ==========================================  ==================
argument                           environment variable                        default
=================================  ==========================================  ==================
``--model``                        ``RESPONSES_LEDGER_MODEL``                  (required)
``--served-model-name`` (repeat)   ``RESPONSES_LEDGER_SERVED_MODEL_NAME`` (a,b)  the model
``--tensor-parallel-size``         ``RESPONSES_LEDGER_VLLM_TENSOR_PARALLEL_SIZE``  1
``--data-parallel-size``           ``RESPONSES_LEDGER_VLLM_DATA_PARALLEL_SIZE``  1
``--max-model-len``                ``RESPONSES_LEDGER_VLLM_MAX_MODEL_LEN``     the model's
``--gpu-memory-utilization``       ``RESPONSES_LEDGER_VLLM_GPU_MEMORY_UTILIZATION``  vLLM's (0.9)
``--kv-cache-memory-bytes``        ``RESPONSES_LEDGER_VLLM_KV_CACHE_MEMORY_BYTES``  vLLM's (``4G`` ok)
``--dtype``                        ``RESPONSES_LEDGER_VLLM_DTYPE``             ``auto``
``--enforce-eager``                ``RESPONSES_LEDGER_VLLM_ENFORCE_EAGER``     off (``1``: on)
``--seed``                         ``RESPONSES_LEDGER_VLLM_SEED``              0
``--load-format``                  ``RESPONSES_LEDGER_VLLM_LOAD_FORMAT``       ``auto``
``--tokenizer``                    ``RESPONSES_LEDGER_VLLM_TOKENIZER``         the model's, if any
``--logit-bias`` (JSON)            ``RESPONSES_LEDGER_VLLM_LOGIT_BIAS``        ``{}``
``--vllm-engine-args`` (JSON)      ``RESPONSES_LEDGER_VLLM_ENGINE_ARGS``       ``{}``
=================================  ==========================================  ==================

``--logit-bias`` is a JSON object of token id -> bias added to every request (a request's own bias
wins for the same id). It is for random-weight models, which never end a message by chance:
``{"200007": 6}`` makes ``<|end|>`` likely, so a test model's reasoning ends after a few tokens.
``--vllm-engine-args`` is a JSON object of any further ``AsyncEngineArgs`` fields, e.g.
``{"max_num_seqs": 128, "enable_prefix_caching": false}``. ``--load-format dummy`` fills the
weights with random values (see ``app.engines.tiny_model``). The model variables are the ones
``app.settings`` reads too. None of ours is named ``VLLM_*``: vLLM treats every ``VLLM_*``
variable as its own and warns about (on some platforms refuses) names it does not know. vLLM's own
variables (``VLLM_CPU_KVCACHE_SPACE``, ``VLLM_CACHE_ROOT``, ...) work as vLLM documents them.

``vllm`` is imported only by :meth:`VllmEngine.start`, so this module (and the CLI that builds the
config) loads without vLLM installed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import logging
import os
import re
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from app.engines.protocol import (
    EngineChunk,
    EngineError,
    FinishReason,
    PromptTooLong,
    Pushable,
    Sampling,
)
from app.startup import StartupError
from domain.logprobs import TokenLogprob

if TYPE_CHECKING:
    from vllm.outputs import RequestOutput
    from vllm.v1.engine.async_llm import AsyncLLM

    from app.settings import Settings

__all__ = [
    "ENGINE_OPTION_FLAGS",
    "ENGINE_OPTION_NAMES",
    "HARMONY_STOP_TOKEN_IDS",
    "VllmEngine",
    "VllmEngineConfig",
    "add_engine_arguments",
    "config_for",
    "engine_config_from",
    "parse_bytes",
]

log = logging.getLogger(__name__)

#: ``<|return|>`` and ``<|call|>`` in o200k_harmony: the only ways a gpt-oss turn ends.
HARMONY_STOP_TOKEN_IDS: tuple[int, ...] = (200002, 200012)

_ENV_PREFIX = "RESPONSES_LEDGER_VLLM_"
_FINISH_REASONS: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "abort": "abort",
    "error": "error",
}


@dataclass(frozen=True, slots=True)
class VllmEngineConfig:
    """Everything :class:`VllmEngine` passes to vLLM. ``None`` leaves vLLM's default."""

    model: str
    served_model_names: tuple[str, ...] = ()
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_memory_bytes: int | None = None
    dtype: str = "auto"
    enforce_eager: bool = False
    seed: int | None = 0
    load_format: str = "auto"
    #: A tokenizer (directory or name) for structured outputs; None: the model directory's
    #: ``tokenizer.json`` when it has one, else none (no structured outputs).
    tokenizer: str | None = None
    #: Hand vLLM's Prometheus stat logger to the engine, so that ``/metrics`` serves its
    #: ``vllm:*`` metrics (``app.metrics``); off with ``RESPONSES_LEDGER_METRICS=false``.
    prometheus: bool = True
    #: token id -> bias added to every request (random-weight test models).
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    #: Passed to ``AsyncEngineArgs`` as they are, after (and over) the fields above.
    extra_engine_args: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("a vLLM model (path or name) is required")
        object.__setattr__(self, "served_model_names", tuple(self.served_model_names))
        object.__setattr__(
            self, "extra_engine_args", MappingProxyType(dict(self.extra_engine_args))
        )
        object.__setattr__(
            self,
            "logit_bias",
            MappingProxyType({int(k): float(v) for k, v in self.logit_bias.items()}),
        )

    @property
    def model_names(self) -> tuple[str, ...]:
        return self.served_model_names or (self.model,)

    @property
    def resolved_tokenizer(self) -> str | None:
        """The tokenizer vLLM loads (see :attr:`tokenizer`), or None."""
        if self.tokenizer:
            return self.tokenizer
        return self.model if (Path(self.model) / "tokenizer.json").is_file() else None

    def engine_args(self) -> dict[str, Any]:
        """Keyword arguments for ``vllm.engine.arg_utils.AsyncEngineArgs``."""
        tokenizer = self.resolved_tokenizer
        args: dict[str, Any] = {
            "model": self.model,
            "served_model_name": list(self.model_names),
            "skip_tokenizer_init": tokenizer is None,
            "tensor_parallel_size": self.tensor_parallel_size,
            "data_parallel_size": self.data_parallel_size,
            "dtype": self.dtype,
            "enforce_eager": self.enforce_eager,
            "seed": self.seed,
            "load_format": self.load_format,
            # Stats are only logged when a server calls do_log_stats(); we never do.
            "disable_log_stats": True,
        }
        optional = {
            "max_model_len": self.max_model_len,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
        }
        args.update({key: value for key, value in optional.items() if value is not None})
        if tokenizer is not None:
            args["tokenizer"] = tokenizer
            args["structured_outputs_config"] = {"backend": "guidance"}
        args.update(self.extra_engine_args)
        return args


# -- configuration from arguments and environment -----------------------------------------------

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(text: str) -> int:
    """``1073741824``, ``1G``, ``512MiB``, ``1.5gb`` -> bytes (binary units)."""
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"not a size in bytes: {text!r}")
    number, unit = match.groups()
    return int(float(number) * _SIZE_UNITS[unit.lower()])


def _parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _parse_json_object(text: str) -> dict[str, Any]:
    value = json.loads(text) if text.strip() else {}
    if not isinstance(value, dict):
        raise ValueError(f"vLLM engine args must be a JSON object, got {text!r}")
    return value


def _parse_names(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


# field -> (command-line option, parser). The option's dest is the field name.
_OPTIONS: dict[str, tuple[str, Any]] = {
    "model": ("--model", str),
    "served_model_names": ("--served-model-name", _parse_names),
    "tensor_parallel_size": ("--tensor-parallel-size", int),
    "data_parallel_size": ("--data-parallel-size", int),
    "max_model_len": ("--max-model-len", int),
    "gpu_memory_utilization": ("--gpu-memory-utilization", float),
    "kv_cache_memory_bytes": ("--kv-cache-memory-bytes", parse_bytes),
    "dtype": ("--dtype", str),
    "enforce_eager": ("--enforce-eager", _parse_bool),
    "seed": ("--seed", int),
    "load_format": ("--load-format", str),
    "tokenizer": ("--tokenizer", str),
    "logit_bias": ("--logit-bias", _parse_json_object),
    "extra_engine_args": ("--vllm-engine-args", _parse_json_object),
}
_ENV_NAMES = {name: f"{_ENV_PREFIX}{name.upper()}" for name in _OPTIONS} | {
    "model": "RESPONSES_LEDGER_MODEL",
    "served_model_names": "RESPONSES_LEDGER_SERVED_MODEL_NAME",
    "extra_engine_args": f"{_ENV_PREFIX}ENGINE_ARGS",
}


def add_engine_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the vLLM options (table in the module docstring) to ``parser``.

    Every option defaults to None so that :func:`engine_config_from` can tell "not given" from a
    value and fall back to the environment. A CLI that defines ``--model`` or
    ``--served-model-name`` itself can skip this and use the same ``dest`` names (the field names).
    """
    group = parser.add_argument_group("vLLM engine", "(environment: RESPONSES_LEDGER_VLLM_*)")
    for name, (option, convert) in _OPTIONS.items():
        help_text = f"env {_ENV_NAMES[name]}"
        metavar = (
            "JSON"
            if name in ("extra_engine_args", "logit_bias")
            else option[2:].upper().replace("-", "_")
        )
        if name == "served_model_names":
            group.add_argument(
                option, dest=name, action="append", default=None, metavar="NAME", help=help_text
            )
        elif name == "enforce_eager":
            group.add_argument(
                option,
                dest=name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=help_text,
            )
        else:
            group.add_argument(
                option, dest=name, type=convert, default=None, metavar=metavar, help=help_text
            )
    return parser


def config_for(settings: Settings) -> VllmEngineConfig:
    """The engine's config for the server's settings (its model and served names, the vLLM
    options of its command line, the environment's), or why it cannot start, in one line
    (``StartupError``): a ``RESPONSES_LEDGER_VLLM_*`` variable that does not parse, or a model
    path that is not there (vLLM takes it for a Hugging Face name, and refuses that in a long
    traceback)."""
    model = settings.model or ""
    if model.startswith(("/", "./", "../", "~")) and not Path(model).expanduser().exists():
        raise StartupError(f"the model {model}: no such file or directory")
    try:
        return engine_config_from(
            None,
            model=settings.model,
            served_model_names=settings.served_model_names or None,
            **settings.engine_options,
        )
    except ValueError as exc:
        raise StartupError(str(exc)) from None


def engine_config_from(
    args: argparse.Namespace | None = None,
    environ: Mapping[str, str] | None = None,
    **overrides: Any,
) -> VllmEngineConfig:
    """Build the config. Precedence: ``overrides`` (keyword = field name; None is ignored), then a
    command-line value in ``args``, then the environment, then the default. Raises ValueError
    naming the variable that does not parse, or saying that no model was given."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for name, (_option, convert) in _OPTIONS.items():
        given = getattr(args, name, None) if args is not None else None
        if overrides.get(name) is not None:
            values[name] = overrides[name]
        elif given is not None:
            if name == "served_model_names":
                # --served-model-name a --served-model-name b, or --served-model-name a,b
                items = [given] if isinstance(given, str) else given
                given = tuple(n for item in items for n in _parse_names(item))
            values[name] = given
        elif raw := environ.get(_ENV_NAMES[name], "").strip():
            try:
                values[name] = convert(raw)
            except ValueError as exc:
                raise ValueError(f"{_ENV_NAMES[name]}={raw!r}: {exc}") from exc
    unknown = set(overrides) - set(_OPTIONS)
    if unknown:
        raise TypeError(f"unknown vLLM engine settings: {', '.join(sorted(unknown))}")
    if "model" not in values:
        raise ValueError(f"no vLLM model: pass --model or set {_ENV_NAMES['model']}")
    return VllmEngineConfig(**values)


# -- the engine -------------------------------------------------------------------------------------


class VllmEngine:
    """``Engine`` backed by ``vllm.v1.engine.async_llm.AsyncLLM`` in this process.

    ``vocab_size`` and ``max_model_len`` are vLLM's resolved values and are known once
    :meth:`start` has returned (before that ``vocab_size`` is 0 and generate() refuses).
    """

    supports_logprobs = True

    def __init__(self, config: VllmEngineConfig, *, core: Mapping[str, Any] | None = None) -> None:
        """``core``: attach to an engine core another process started (``app.frontends``): its
        ZMQ addresses as vLLM's ``client_addresses``, with ``client_count`` and
        ``client_index``; None starts this process's own engine core."""
        self.config = config
        self._core = dict(core) if core is not None else None
        self.model_names: tuple[str, ...] = config.model_names
        self.vocab_size: int = 0
        self.max_model_len: int | None = config.max_model_len
        self._llm: AsyncLLM | None = None
        self._dead: str | None = None
        #: Structured outputs (``Sampling.grammar``) are enforced: vLLM has a tokenizer.
        self.constrains: bool = config.resolved_tokenizer is not None
        #: Added to every request's ``logit_bias`` (``--logit-bias``).
        self.logit_bias: dict[int, float] = dict(config.logit_bias)
        #: Aborts of pushed requests whose consumer left, until vLLM has them.
        self._aborts: set[asyncio.Future[None]] = set()
        #: Requests being pushed (``_Pushed``): a stop ends each with an error.
        self._pushed: set[_Pushed] = set()

    async def start(self) -> None:
        """Start vLLM's engine core (blocks the loop while it loads, as vLLM's own server does)."""
        if self._llm is not None:
            return
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.metrics.loggers import PrometheusStatLogger

        engine_args = AsyncEngineArgs(**self.config.engine_args())
        # With a stat logger and ``disable_log_stats`` vLLM records its stats for that logger
        # only (not its periodic log lines): PrometheusStatLogger registers the ``vllm:*``
        # metrics in prometheus_client's global registry, as vLLM's own server does.
        # (typed as Any: vLLM annotates a list of its logger base classes, and a list is invariant)
        loggers: list[Any] | None = [PrometheusStatLogger] if self.config.prometheus else None
        # No local holding the AsyncLLM: something in vLLM's start-up keeps this frame alive,
        # and a frame holding it would keep it from being collected by stop().
        if self._core is None:
            self._llm = AsyncLLM.from_engine_args(engine_args, stat_loggers=loggers)
        else:  # one of several API-server processes of one engine core (vLLM's api-server-count)
            addresses = dict(self._core)
            count, index = addresses.pop("client_count"), addresses.pop("client_index")
            engine_args._api_process_count = count
            engine_args._api_process_rank = index
            self._llm = AsyncLLM.from_vllm_config(
                engine_args.create_engine_config(),
                client_addresses=addresses,
                client_count=count,
                client_index=index,
                stat_loggers=loggers,
            )
        self.vocab_size = self._llm.model_config.get_vocab_size()
        self.max_model_len = self._llm.model_config.max_model_len
        self._dead = None
        if self.constrains:
            await self._warm_up_grammars()
        log.info(
            "vLLM engine ready: model=%s vocab_size=%d max_model_len=%d",
            self.config.model,
            self.vocab_size,
            self.max_model_len,
        )

    async def _warm_up_grammars(self) -> None:
        """One constrained token, so that the first client's request does not pay for vLLM's
        structured-output backend starting (it indexes the whole vocabulary: measured 6-8 s on
        two CPUs for o200k_harmony)."""
        warm = Sampling(max_tokens=1, grammar='start: "ok"\n')
        async for _chunk in self.generate([200006], warm, "warm-up-grammars"):  # <|start|>
            pass

    async def stop(self) -> None:
        llm, self._llm = self._llm, None
        if llm is None:
            return
        # Blocking (it joins the engine core); run off the loop so open streams can finish. It
        # hands the closing of its asyncio sockets back to this loop, which has run that callback
        # by the time the thread's result arrives.
        await asyncio.to_thread(llm.shutdown)
        for pushed in list(self._pushed):  # (its output handler is gone: nothing more comes)
            pushed.stopped()
        # vLLM never terminates its ZMQ context; once it is garbage collected pyzmq warns
        # ("Unclosed context"), which the test suite turns into an error. All its sockets are
        # closed now, so terminating it cannot block.
        resources = getattr(llm.engine_core, "resources", None)
        ctx = getattr(resources, "ctx", None)
        if ctx is not None and not ctx.closed:
            ctx.destroy(linger=0)
        # AsyncLLM sits in reference cycles; collected at interpreter exit its __del__ calls
        # shutdown() again with the module globals already gone ("Exception ignored ...
        # 'NoneType' object is not callable"). Collect it now, while shutdown() is a no-op.
        del llm, resources, ctx
        gc.collect()

    def healthy(self) -> bool:
        if self._llm is None or self._dead is not None:
            return False
        if self._llm.errored:
            self._dead = "vLLM engine core is dead"
            return False
        return True

    @property
    def num_unfinished_requests(self) -> int:
        """Requests vLLM is still tracking (queued or running); 0 when stopped."""
        return 0 if self._llm is None else self._llm.get_num_unfinished_requests()

    async def abort(self, request_id: str) -> None:
        if self._llm is not None and self._dead is None:
            await self._llm.abort(request_id)

    def generate(
        self, prompt_token_ids: Sequence[int], sampling: Sampling, request_id: str
    ) -> AsyncIterator[EngineChunk]:
        """Validate now (raising ``EngineError``/``PromptTooLong``), then stream lazily: pushed
        from vLLM's output handler (``_Pushed``), or read."""
        if self._llm is None:
            raise EngineError("the vLLM engine is not started")
        prompt = list(prompt_token_ids)
        self._check_prompt(prompt)
        max_tokens = self._max_tokens(len(prompt), sampling.max_tokens)
        if sampling.grammar is not None and not self.constrains:
            raise EngineError("this vLLM engine has no tokenizer, so it cannot enforce a grammar")
        self._check_ids(sampling.logit_bias, "logit_bias token id")
        self._check_ids(self.logit_bias, "--logit-bias token id")
        self._check_ids(sampling.stop_token_ids, "stop token id")
        return _Pushed(self, prompt, sampling, max_tokens, request_id)

    # -- internals ----------------------------------------------------------------------------------

    def _check_prompt(self, prompt: list[int]) -> None:
        if not prompt:
            raise EngineError("the prompt has no tokens")
        self._check_ids(prompt, "prompt token id")

    def _check_ids(self, ids: Sequence[int] | Mapping[int, float], what: str) -> None:
        if not ids:
            return
        try:
            in_range = min(ids) >= 0 and max(ids) < self.vocab_size
        except TypeError:
            in_range = False
        if in_range and all(type(token_id) is int for token_id in ids):
            return
        for index, token_id in enumerate(ids):
            if type(token_id) is not int or not 0 <= token_id < self.vocab_size:
                raise EngineError(
                    f"{what} {token_id!r} (position {index}) is outside the model's vocabulary "
                    f"[0, {self.vocab_size})"
                )

    def _max_tokens(self, prompt_len: int, requested: int | None) -> int:
        limit = self.max_model_len
        assert limit is not None  # resolved by start()
        if requested is not None and requested < 1:
            raise EngineError(f"max_tokens must be at least 1, got {requested}")
        remaining = limit - prompt_len
        if remaining < 1:
            raise PromptTooLong(prompt_len, requested, limit)
        if requested is None:
            return remaining
        if requested > remaining:
            raise PromptTooLong(prompt_len, requested, limit)
        return requested

    def _sampling_params(self, sampling: Sampling, max_tokens: int) -> Any:
        from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

        stop = list(dict.fromkeys((*HARMONY_STOP_TOKEN_IDS, *sampling.stop_token_ids)))
        optional: dict[str, Any] = {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": sampling.seed,
            "presence_penalty": sampling.presence_penalty,
            "frequency_penalty": sampling.frequency_penalty,
            "logprobs": sampling.logprobs,
            "flat_logprobs": True if sampling.logprobs is not None else None,
        }
        return SamplingParams(
            max_tokens=max_tokens,
            stop_token_ids=stop,
            logit_bias={**self.logit_bias, **sampling.logit_bias} or None,
            output_kind=RequestOutputKind.DELTA,
            detokenize=False,
            skip_special_tokens=False,
            structured_outputs=StructuredOutputsParams(grammar=sampling.grammar)
            if sampling.grammar
            else None,
            **{key: value for key, value in optional.items() if value is not None},
        )

    async def _stream(
        self, prompt: list[int], sampling: Sampling, max_tokens: int, request_id: str
    ) -> AsyncGenerator[EngineChunk, None]:
        from vllm.exceptions import VLLMClientError
        from vllm.inputs import TokensPrompt

        llm = self._llm
        if llm is None or not self.healthy():
            yield self._unavailable()
            return
        params = self._sampling_params(sampling, max_tokens)
        outputs = llm.generate(TokensPrompt(prompt_token_ids=prompt), params, request_id)
        finished = False
        try:
            async for output in outputs:
                chunk = self._chunk(output, sampling.logprobs)
                finished = chunk.finish_reason is not None
                yield chunk
                if finished:
                    return
            # vLLM's stream ended without a finished output: only a shutdown does that.
            finished = True
            yield _STOPPED
        except VLLMClientError as exc:
            finished = True  # vLLM rejected the request before it started
            raise _rejected(exc) from exc
        except Exception as exc:  # the engine died, or this request failed (EngineGenerateError)
            finished = True
            yield self._error_chunk(request_id, exc)
        finally:
            if not finished:
                # The consumer went away (aclose / GeneratorExit / CancelledError): free the
                # request in vLLM. Closing vLLM's generator aborts it; abort() again is a no-op.
                await outputs.aclose()
                if self._llm is not None and self._dead is None:
                    await self._llm.abort(request_id)

    def _error_chunk(self, request_id: str, exc: BaseException) -> EngineChunk:
        """The last chunk of a request vLLM failed (``_stream``'s and ``_Pushed``'s)."""
        from vllm.v1.engine.exceptions import EngineDeadError

        if isinstance(exc, EngineDeadError):
            self._dead = f"vLLM engine core died: {exc}"
            log.error("request %s: %s", request_id, self._dead)
            return EngineChunk((), finish_reason="error", error=self._dead)
        log.error("request %s failed in vLLM", request_id, exc_info=exc)
        cause = exc.__cause__ or exc
        return EngineChunk((), finish_reason="error", error=f"{type(cause).__name__}: {cause}")

    def _unavailable(self) -> EngineChunk:
        """The last chunk of a request made while the engine is stopped or dead."""
        return EngineChunk((), finish_reason="error", error=self._dead or "engine stopped")

    def _chunk(self, output: RequestOutput, top_k: int | None) -> EngineChunk:
        """The chunk of vLLM's ``output``; with ``top_k``, its tokens' log probabilities too (as
        ``Sampling.logprobs`` asked)."""
        chunk = self._plain_chunk(output)
        if top_k is not None:
            chunk = _with_logprobs(chunk, output.outputs[0].logprobs, top_k)
        return chunk

    def _plain_chunk(self, output: RequestOutput) -> EngineChunk:
        completion = output.outputs[0]
        cached = output.num_cached_tokens
        if not output.finished:
            return EngineChunk(tuple(completion.token_ids), num_cached_tokens=cached)
        raw = completion.finish_reason or "error"
        reason = _FINISH_REASONS.get(raw)
        if reason is None:
            return EngineChunk(
                tuple(completion.token_ids),
                finish_reason="error",
                num_cached_tokens=cached,
                error=f"vLLM finished the request with reason {raw!r}",
            )
        return EngineChunk(
            tuple(completion.token_ids),
            finish_reason=reason,
            num_cached_tokens=cached,
            error="vLLM reported an error for this request" if reason == "error" else None,
        )


class _Pushed(Pushable):
    """A vLLM request whose outputs vLLM's output handler hands straight to the consumer
    (``app.engines.protocol.PushedChunks``): the request's output collector, whose ``put`` the
    handler calls with each step's output, is given a ``put`` of ours that makes the chunk and
    calls the sink there, instead of setting an event that wakes ``AsyncLLM.generate``'s task,
    which would pass the output up two async generators to the consumer's task. While the sink
    has asked to wait (the log is behind), outputs go to the collector as vLLM made them (it
    merges them) and are handed over once the wait is over. Read with ``async for``, it is
    ``VllmEngine._stream``."""

    def __init__(
        self,
        engine: VllmEngine,
        prompt: list[int],
        sampling: Sampling,
        max_tokens: int,
        request_id: str,
    ) -> None:
        self._engine = engine
        self._args = (prompt, sampling, max_tokens, request_id)
        self._queue: Any = None  # vLLM's RequestOutputCollector, once the request is added
        self._adding: asyncio.Task[None] | None = None
        self._vllm_put: Any = None  # the collector's own put
        self._waiting = False

    def _open_reader(self) -> AsyncGenerator[EngineChunk, None]:
        return self._engine._stream(*self._args)

    def _begin(self) -> None:
        self._adding = asyncio.ensure_future(self._add())
        self._engine._pushed.add(self)

    def stopped(self) -> None:
        """The engine stopped: the request ends with an error."""
        self._send(_STOPPED)

    async def _add(self) -> None:
        from vllm.exceptions import VLLMClientError
        from vllm.inputs import TokensPrompt

        engine = self._engine
        prompt, sampling, max_tokens, request_id = self._args
        llm = engine._llm
        if llm is None or not engine.healthy():
            self._send(engine._unavailable())
            return
        try:
            params = engine._sampling_params(sampling, max_tokens)
            queue = await llm.add_request(request_id, TokensPrompt(prompt_token_ids=prompt), params)
        except VLLMClientError as exc:  # vLLM rejected the request before it started
            self._fail(_rejected(exc))
            return
        except Exception as exc:
            self._send(engine._error_chunk(request_id, exc))
            return
        self._queue = queue
        if self._sink is None:  # the consumer left while it was added
            self._abort()
            return
        self._vllm_put = queue.put
        queue.put = self._put  # type: ignore[method-assign]  # vLLM's output handler calls ours
        self._take_held()  # what the handler put before that, if anything

    def _put(self, output: Any) -> None:
        """vLLM's output handler's call, with the request's next output (or an exception)."""
        if self._sink is None:
            return
        if self._waiting:  # vLLM's collector holds (and merges) them until the wait is over
            self._vllm_put(output)
            return
        self._take(output)

    def _take_held(self) -> None:
        """Take what vLLM's collector holds, if anything (``get_nowait`` raises what it holds
        when that is an exception)."""
        try:
            held = self._queue.get_nowait()
        except Exception as exc:
            held = exc
        if held is not None:
            self._take(held)

    def _take(self, output: Any) -> None:
        engine = self._engine
        request_id = self._args[3]
        if isinstance(output, BaseException):
            self._send(engine._error_chunk(request_id, output))
            return
        try:
            chunk = engine._chunk(output, self._args[1].logprobs)
        except Exception as exc:  # (EngineError: logprobs vLLM did not give)
            self._fail(exc)
            return
        wait = self._send(chunk)
        if wait is not None and self._sink is not None:
            self._waiting = True
            asyncio.ensure_future(wait).add_done_callback(self._resume)

    def _resume(self, _: Awaitable[None]) -> None:
        self._waiting = False
        if self._sink is not None and self._queue is not None:
            self._take_held()  # what vLLM's collector merged meanwhile

    def close(self) -> None:
        """Push nothing more; a request vLLM has not finished is aborted."""
        self._engine._pushed.discard(self)
        if self._sink is None and self._done is not None and self._done.done():
            return
        super().close()
        if self._queue is not None or self._adding is None or self._adding.done():
            self._abort()

    def _abort(self) -> None:
        queue, self._queue = self._queue, None
        if queue is None:
            return
        queue.close()
        engine = self._engine
        if not self._finished and engine._llm is not None and engine._dead is None:
            task = asyncio.ensure_future(engine._llm.abort(self._args[3]))
            engine._aborts.add(task)  # (held until done: the loop keeps only weak references)
            task.add_done_callback(engine._aborts.discard)


#: The last chunk of a request whose engine stopped under it (``VllmEngine.stop``).
_STOPPED = EngineChunk((), finish_reason="error", error="the vLLM engine stopped")


def _rejected(exc: Exception) -> EngineError:
    """What a request vLLM refused before it started (its ``VLLMClientError``) raises."""
    return EngineError(f"vLLM rejected the request: {exc}")


def _with_logprobs(chunk: EngineChunk, logprobs: Any, k: int) -> EngineChunk:
    """``chunk`` with its tokens' log probabilities, from vLLM's ``logprobs`` of the new
    positions (``k``: how many top ones were asked for)."""
    count = len(chunk.token_ids)
    if count == 0:
        return chunk
    if logprobs is None or len(logprobs) != count:
        got = "none" if logprobs is None else len(logprobs)
        raise EngineError(f"vLLM returned logprobs for {got} of {count} new tokens")
    entries: list[TokenLogprob] = []
    if hasattr(logprobs, "start_indices"):
        # FlatLogprobs: per position the sampled token's entry, then the top k in rank order
        ids, values = logprobs.token_ids, logprobs.logprobs
        for start, end in zip(logprobs.start_indices, logprobs.end_indices, strict=True):
            top = list(zip(ids[start + 1 : end], values[start + 1 : end], strict=True))
            entries.append((values[start], top))
    else:
        # {token id: Logprob(logprob, rank)} per position: the sampled token is merged into the
        # top k when it is one of them (rank <= k)
        for token_id, position in zip(chunk.token_ids, logprobs, strict=True):
            ranked = sorted(
                (lp.rank, tid, lp.logprob)
                for tid, lp in position.items()
                if lp.rank is not None and lp.rank <= k
            )
            entries.append((position[token_id].logprob, [(tid, value) for _, tid, value in ranked]))
    return dataclasses.replace(chunk, logprobs=entries)


#: The settings names :func:`add_engine_arguments` adds (each one's argparse ``dest``).
ENGINE_OPTION_NAMES: tuple[str, ...] = tuple(_OPTIONS)
#: Each option's command-line flag, by name.
ENGINE_OPTION_FLAGS: Mapping[str, str] = {name: flag for name, (flag, _) in _OPTIONS.items()}
