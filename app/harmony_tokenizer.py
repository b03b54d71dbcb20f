"""The o200k_harmony tokenizer as Hugging Face tokenizer files, built offline and checked.

vLLM's structured outputs (the ``guidance`` backend, llguidance) need a tokenizer: they compute,
for every step, which token ids may come next, and for that they must know the bytes of every id.
A real gpt-oss model directory has its own ``tokenizer.json``; the tiny random-weight test model
(:mod:`app.engines.tiny_model`) has only ``config.json``, and nothing can be downloaded. So
:func:`write_tokenizer_files` builds the tokenizer gpt-oss uses from what is already here:

- the 199,998 ranks of ``o200k_base.tiktoken`` (found or built, and checked against tiktoken's
  sha256, by :func:`app.encoding.ensure_vocab_dir`), turned into a byte-level BPE with
  ``transformers``' ``TikTokenConverter`` and o200k's pre-tokenizer pattern;
- Harmony's special tokens, ids 199,998 to 201,087 (``<|startoftext|>``, ``<|endoftext|>``,
  ``<|return|>``, ``<|channel|>``, ..., ``<|reserved_201087|>``), named as openai_harmony names
  them.

:func:`verify_tokenizer` then holds the result against openai_harmony itself: every id's bytes
(the normal ids against the verified vocabulary file, each special id's text and its being
special against Harmony), and the encoding of a corpus of texts (words, numbers, code, CJK,
emoji, whitespace runs) against Harmony's own ``encode``. Files that fail are never kept.
Harmony stays the one renderer and decoder: this tokenizer only tells vLLM what each id is.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

from openai_harmony import HarmonyEncoding

from app.encoding import O200K_BASE_FILE, O200K_BASE_SHA256, ensure_vocab_dir, load_encoding

__all__ = [
    "FIRST_SPECIAL_ID",
    "O200K_PATTERN",
    "TOKENIZER_FILES",
    "TokenizerMismatch",
    "has_tokenizer",
    "verify_tokenizer",
    "write_tokenizer_files",
]

#: o200k's pre-tokenizer split (tiktoken's ``o200k_base`` pattern).
O200K_PATTERN = "|".join(
    [
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)
#: The first special id; o200k_base's ranks are 0..199,997.
FIRST_SPECIAL_ID = 199_998
#: gpt-oss's embedding rows: the last special id is this minus one.
_VOCAB_SIZE = 201_088
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
#: Texts whose token ids must be Harmony's exactly.
_CORPUS = (
    "Hello, world! How's it going? I'd say we'll see.",
    "  leading spaces, trailing spaces   \n\n\tand\ttabs\r\n",
    "1234567890 3.14159 -42 1e10 0xFF 1,000,000",
    'def f(x):\n    return {"a": [1, 2, 3], "b": None}  # comment\n',
    "SELECT id, name FROM users WHERE id = 17;",
    "日本語のテキストと中文文本\uff0c还有한국어\u3002",
    "Emoji: 😀🎉👍🏽 and accents: café naïve Ærø ß",
    "*** Begin Patch\n*** Update File: a.py\n@@\n-old\n+new\n*** End Patch\n",
    "CamelCaseWords snake_case_words kebab-case-words ALLCAPS MiXeD",
    "\u00a0non-breaking\u2003em-space\u200bzero-width",
    '{"city": "Paris", "units": "celsius", "days": [1, 2]}',
    "a" * 300 + " " + "🙂" * 40,
)


class TokenizerMismatch(RuntimeError):
    """Built tokenizer files disagree with openai_harmony (the files are not kept)."""


def has_tokenizer(directory: Path | str) -> bool:
    """Whether ``directory`` holds a Hugging Face fast tokenizer (a model's own, or ours)."""
    return (Path(directory) / "tokenizer.json").is_file()


def _special_names(encoding: HarmonyEncoding) -> list[str]:
    names = []
    for token_id in range(FIRST_SPECIAL_ID, _VOCAB_SIZE):
        if not encoding.is_special_token(token_id):
            raise TokenizerMismatch(f"Harmony does not call id {token_id} special")
        names.append(encoding.decode_utf8([token_id]))
    return names


def _build(target: Path, encoding: HarmonyEncoding) -> None:
    from tokenizers import AddedToken
    from transformers.convert_slow_tokenizer import TikTokenConverter

    vocab_file = _vocab_dir() / O200K_BASE_FILE
    specials = _special_names(encoding)
    converter = TikTokenConverter(vocab_file=str(vocab_file), pattern=O200K_PATTERN)  # type: ignore[no-untyped-call]
    tokenizer = converter.converted()
    if tokenizer.get_vocab_size() != FIRST_SPECIAL_ID:
        raise TokenizerMismatch(
            f"o200k_base has {tokenizer.get_vocab_size()} ranks, not {FIRST_SPECIAL_ID}"
        )
    tokenizer.add_special_tokens(
        [AddedToken(name, special=True, normalized=False) for name in specials]
    )
    tokenizer.save(str(target / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|startoftext|>",
        "eos_token": "<|return|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 131072,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {
            str(FIRST_SPECIAL_ID + index): {
                "content": name,
                "special": True,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "single_word": False,
            }
            for index, name in enumerate(specials)
        },
    }
    (target / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    special_map = {
        "bos_token": "<|startoftext|>",
        "eos_token": "<|return|>",
        "pad_token": "<|endoftext|>",
    }
    (target / "special_tokens_map.json").write_text(json.dumps(special_map, indent=1))


def verify_tokenizer(directory: Path | str, encoding: HarmonyEncoding | None = None) -> None:
    """Raise :class:`TokenizerMismatch` unless the tokenizer in ``directory`` is o200k_harmony id
    for id (see the module docstring)."""
    from tiktoken.load import load_tiktoken_bpe
    from tokenizers import Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    encoding = encoding or load_encoding()
    tokenizer = Tokenizer.from_file(str(Path(directory) / "tokenizer.json"))
    if tokenizer.get_vocab_size(with_added_tokens=True) != _VOCAB_SIZE:
        raise TokenizerMismatch(
            f"{tokenizer.get_vocab_size(with_added_tokens=True)} ids, not {_VOCAB_SIZE}"
        )
    byte_of = {char: byte for byte, char in bytes_to_unicode().items()}  # type: ignore[no-untyped-call]
    ranks = load_tiktoken_bpe(str(_vocab_dir() / O200K_BASE_FILE), expected_hash=O200K_BASE_SHA256)
    by_id = {rank: token for token, rank in ranks.items()}
    if sorted(by_id) != list(range(FIRST_SPECIAL_ID)):
        raise TokenizerMismatch("the vocabulary file's ranks are not 0..199997")
    for token_id in range(FIRST_SPECIAL_ID):
        piece = tokenizer.id_to_token(token_id)
        if piece is None or bytes(byte_of[char] for char in piece) != by_id[token_id]:
            raise TokenizerMismatch(f"id {token_id}: {piece!r} is not {by_id[token_id]!r}")
    for token_id, name in enumerate(_special_names(encoding), start=FIRST_SPECIAL_ID):
        if tokenizer.id_to_token(token_id) != name:
            raise TokenizerMismatch(
                f"special id {token_id}: {tokenizer.id_to_token(token_id)!r} is not {name!r}"
            )
    for text in _CORPUS:
        ours = tokenizer.encode(text, add_special_tokens=False).ids
        harmony = [int(t) for t in encoding.encode(text, disallowed_special=())]
        if ours != harmony:
            raise TokenizerMismatch(
                f"{text[:40]!r}: {ours[:12]}... is not Harmony's {harmony[:12]}..."
            )
    # and a special token in text is one id, as Harmony has it
    for name in ("<|channel|>", "<|return|>", "<|reserved_200711|>"):
        if tokenizer.encode(name, add_special_tokens=False).ids != [
            int(t) for t in encoding.encode(name, allowed_special={name}, disallowed_special=())
        ]:
            raise TokenizerMismatch(f"{name} is not one id")


def _vocab_dir() -> Path:
    found = ensure_vocab_dir()
    if found is None:
        raise TokenizerMismatch("no verified o200k_base vocabulary (install the 'vocab' extra)")
    return found


def _cache_dir() -> Path:
    """Where a verified build is kept: next to the verified vocabulary, keyed by its hash."""
    key = hashlib.sha256(f"{O200K_BASE_SHA256}:{O200K_PATTERN}:{_VOCAB_SIZE}".encode()).hexdigest()[
        :16
    ]
    return _vocab_dir().parent / f"o200k_harmony-tokenizer-{key}"


def write_tokenizer_files(directory: Path | str, encoding: HarmonyEncoding | None = None) -> Path:
    """Put the o200k_harmony tokenizer files into ``directory`` (a model directory) and return it.

    The first call builds and verifies them (about 20 s) into the project's cache; later calls
    copy the cached, verified files.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cached = _cache_dir()
    if not all((cached / name).is_file() for name in TOKENIZER_FILES):
        encoding = encoding or load_encoding()
        cached.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cached.parent) as scratch:
            built = Path(scratch) / "build"
            built.mkdir()
            _build(built, encoding)
            verify_tokenizer(built, encoding)
            try:
                built.rename(cached)
            except OSError:
                if not all((cached / name).is_file() for name in TOKENIZER_FILES):
                    raise  # not another process having built it first
    for name in TOKENIZER_FILES:
        shutil.copyfile(cached / name, directory / name)
    return directory
