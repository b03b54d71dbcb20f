"""The Harmony vocabulary is built offline, verified, and works."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from openai_harmony import Conversation, Message, Role

from app import encoding


def test_builds_o200k_base_offline_with_the_tiktoken_hash(tmp_path: Path) -> None:
    target = encoding.build_o200k_base(tmp_path)
    assert target.name == "o200k_base.tiktoken"
    assert hashlib.sha256(target.read_bytes()).hexdigest() == encoding.O200K_BASE_SHA256


def test_refuses_a_cached_file_with_another_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TIKTOKEN_ENCODINGS_BASE", raising=False)
    (tmp_path / "o200k_base.tiktoken").write_bytes(b"not the vocabulary\n")
    with pytest.raises(encoding.VocabError, match="refusing"):
        encoding.ensure_vocab_dir(tmp_path)


def test_ensure_builds_into_an_empty_cache_and_sets_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TIKTOKEN_ENCODINGS_BASE", raising=False)
    directory = encoding.ensure_vocab_dir(tmp_path / "cache")
    assert directory == tmp_path / "cache"
    assert (directory / "o200k_base.tiktoken").exists()
    import os

    assert os.environ["TIKTOKEN_ENCODINGS_BASE"] == str(directory)


def test_an_explicit_directory_is_used_as_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", str(tmp_path))
    assert encoding.ensure_vocab_dir(tmp_path / "unused") == tmp_path
    assert not (tmp_path / "unused").exists()


def test_encodes_and_decodes_a_harmony_conversation() -> None:
    enc = encoding.load_encoding()
    conversation = Conversation.from_messages(
        [
            Message.from_role_and_content(Role.USER, "What is 2+2?"),
            Message.from_role_and_content(Role.ASSISTANT, "4").with_channel("final"),
        ]
    )
    tokens = enc.render_conversation(conversation)
    text = enc.decode_utf8(tokens)
    assert (
        text
        == "<|start|>user<|message|>What is 2+2?<|end|><|start|>assistant<|channel|>final<|message|>4<|end|>"
    )
    parsed = enc.parse_messages_from_completion_tokens(
        tokens[tokens.index(200006, 1) :], Role.ASSISTANT
    )
    assert parsed[-1].content[0].text == "4"  # type: ignore[union-attr]
