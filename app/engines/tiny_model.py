"""gpt-oss model directories that need no download: a ``config.json`` and the tokenizer files.

vLLM's ``load_format="dummy"`` fills every weight with random values, so a directory holding the
model's ``config.json`` is a complete model for vLLM. The o200k_harmony tokenizer files, built offline and
checked id for id against openai_harmony (:mod:`app.harmony_tokenizer`), are written beside it:
vLLM's structured outputs need them. That gives the test suite a real vLLM engine without
weights, and a GPU benchmark the real gpt-oss-20b shapes without a 13 GB download. Random weights
write random tokens: such a model tests the pipeline, never the words.

- :func:`write_tiny_config`: the smallest gpt-oss that vLLM's CPU build runs (2 layers, hidden 64,
  4 experts), with the real vocabulary so that every Harmony token id is valid.
- :func:`write_gpt_oss_20b_config`: gpt-oss-20b's published hyperparameters.

Both keep gpt-oss's layer pattern (sliding window, then full attention) and its YaRN rope, so the
code paths vLLM takes are those of the real model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = [
    "GPT_OSS_VOCAB_SIZE",
    "gpt_oss_20b_config",
    "tiny_config",
    "write_gpt_oss_20b_config",
    "write_tiny_config",
]

#: o200k_harmony's vocabulary as gpt-oss pads it (the embedding has this many rows).
GPT_OSS_VOCAB_SIZE = 201088
_RETURN = 200002  # <|return|>: the model's EOS
_PAD = 199999  # <|endoftext|>, gpt-oss's pad id


def _layer_types(num_layers: int) -> list[str]:
    return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)]


def _config(
    *,
    num_hidden_layers: int,
    hidden_size: int,
    intermediate_size: int,
    num_attention_heads: int,
    num_key_value_heads: int,
    num_local_experts: int,
    num_experts_per_tok: int,
    max_position_embeddings: int,
) -> dict[str, Any]:
    return {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        # as in gpt-oss's own config.json; without it transformers takes the directory for a
        # Mistral one and warns that its tokenizer's pattern is wrong
        "transformers_version": "4.55.0",
        "attention_bias": True,
        "attention_dropout": 0.0,
        "eos_token_id": _RETURN,
        "pad_token_id": _PAD,
        "experts_per_token": num_experts_per_tok,
        "num_experts_per_tok": num_experts_per_tok,
        "num_local_experts": num_local_experts,
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "initial_context_length": 4096,
        "initializer_range": 0.02,
        "layer_types": _layer_types(num_hidden_layers),
        "max_position_embeddings": max_position_embeddings,
        "num_attention_heads": num_attention_heads,
        "num_hidden_layers": num_hidden_layers,
        "num_key_value_heads": num_key_value_heads,
        "output_router_logits": False,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "original_max_position_embeddings": 4096,
            "truncate": False,
        },
        "rope_theta": 150000,
        "router_aux_loss_coef": 0.9,
        "sliding_window": 128,
        "swiglu_limit": 7.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": GPT_OSS_VOCAB_SIZE,
    }


def tiny_config(max_position_embeddings: int = 4096) -> dict[str, Any]:
    """A two-layer gpt-oss small enough for vLLM's CPU build.

    ``head_dim`` stays 64: the CPU attention backend supports 32-256 in steps of 16 (and 512).
    """
    return _config(
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=max_position_embeddings,
    )


def gpt_oss_20b_config(*, mxfp4: bool = False) -> dict[str, Any]:
    """gpt-oss-20b's architecture (openai/gpt-oss-20b ``config.json``).

    ``mxfp4=True`` adds the published MXFP4 quantization block (experts in MXFP4, the rest in
    bf16), as the released checkpoint is served; without it the dummy model is all bf16 (~42 GB).
    """
    config = _config(
        num_hidden_layers=24,
        hidden_size=2880,
        intermediate_size=2880,
        num_attention_heads=64,
        num_key_value_heads=8,
        num_local_experts=32,
        num_experts_per_tok=4,
        max_position_embeddings=131072,
    )
    if mxfp4:
        config["quantization_config"] = {
            "quant_method": "mxfp4",
            "modules_to_not_convert": [
                "model.layers.*.self_attn",
                "model.layers.*.mlp.router",
                "model.embed_tokens",
                "lm_head",
            ],
        }
    return config


def _write(directory: Path, config: dict[str, Any]) -> Path:
    from app.harmony_tokenizer import write_tokenizer_files

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_tokenizer_files(directory)  # for vLLM's structured outputs (app.harmony_tokenizer)
    return directory


def write_tiny_config(directory: Path | str, max_position_embeddings: int = 4096) -> Path:
    """Write the tiny gpt-oss ``config.json`` into ``directory``; returns the directory."""
    return _write(Path(directory), tiny_config(max_position_embeddings))


def write_gpt_oss_20b_config(directory: Path | str, *, mxfp4: bool = False) -> Path:
    """Write gpt-oss-20b's ``config.json`` into ``directory``; returns the directory."""
    return _write(Path(directory), gpt_oss_20b_config(mxfp4=mxfp4))


if __name__ == "__main__":  # python -m app.engines.tiny_model DIR [tiny|20b|20b-mxfp4]
    import sys

    target, kind = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "tiny")
    writers = {
        "tiny": lambda: write_tiny_config(target),
        "20b": lambda: write_gpt_oss_20b_config(target),
        "20b-mxfp4": lambda: write_gpt_oss_20b_config(target, mxfp4=True),
    }
    if kind not in writers:
        raise SystemExit(f"unknown model kind {kind!r}; choose one of {', '.join(writers)}")
    print(writers[kind]())
