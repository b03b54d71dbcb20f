"""The o200k_harmony tokenizer files built offline (``app.harmony_tokenizer``) are Harmony's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.encoding import load_encoding
from app.harmony_tokenizer import (
    FIRST_SPECIAL_ID,
    TokenizerMismatch,
    verify_tokenizer,
    write_tokenizer_files,
)


def test_built_tokenizer_matches_harmony_id_for_id(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    directory = write_tokenizer_files(tmp_path / "model")
    verify_tokenizer(directory)  # every id's bytes, every special token, a corpus's encoding
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    encoding = load_encoding()
    assert len(tokenizer) == 201088
    assert tokenizer.eos_token_id == 200002  # <|return|>
    text = "<|start|>assistant<|channel|>final<|message|>Bonjour, 世界!<|return|>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids == [int(t) for t in encoding.encode(text, allowed_special="all")]
    assert tokenizer.decode(ids) == text


def test_a_tampered_tokenizer_is_refused(tmp_path: Path) -> None:
    directory = write_tokenizer_files(tmp_path / "model")
    path = directory / "tokenizer.json"
    data = json.loads(path.read_text())
    vocab = data["model"]["vocab"]
    a, b = (
        next(k for k, v in vocab.items() if v == 1000),
        next(k for k, v in vocab.items() if v == 1001),
    )
    vocab[a], vocab[b] = 1001, 1000  # two ids swapped
    path.write_text(json.dumps(data))
    with pytest.raises(TokenizerMismatch, match="id 1000"):
        verify_tokenizer(directory)


def test_special_names_are_harmonys(tmp_path: Path) -> None:
    directory = write_tokenizer_files(tmp_path / "model")
    added = json.loads((directory / "tokenizer_config.json").read_text())["added_tokens_decoder"]
    encoding = load_encoding()
    assert added[str(FIRST_SPECIAL_ID)]["content"] == "<|startoftext|>"
    for token_id in (200005, 200008, 200012, 200711, 201087):
        assert added[str(token_id)]["content"] == encoding.decode_utf8([token_id])
