"""Loading the Harmony encoding without the network.

``openai_harmony.load_harmony_encoding`` reads ``o200k_base.tiktoken`` from the directory named by
``TIKTOKEN_ENCODINGS_BASE`` and otherwise downloads it. Machines without internet access (CI
included) cannot download it, so :func:`ensure_vocab_dir` finds or builds a verified copy first:

1. ``TIKTOKEN_ENCODINGS_BASE`` when the caller already set it (the file is used as it is);
2. the project's cache directory (``RESPONSES_LEDGER_CACHE``, default ``./.cache``) when it already
   holds a file with the right hash;
3. otherwise the file is built offline from the ``quicktok-v1`` package's ``o200k.vocab`` (a
   little-endian binary: u32 count, then per entry u16 length, the token bytes, u32 rank) and kept
   only when its sha256 equals the one tiktoken itself checks.

Without ``quicktok-v1`` installed and without the file, nothing is set and harmony falls back to its
normal download, which works on a machine with internet access.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import struct
import tempfile
from functools import cache
from importlib import resources
from pathlib import Path

from openai_harmony import HarmonyEncoding, HarmonyEncodingName, load_harmony_encoding

__all__ = [
    "O200K_BASE_SHA256",
    "VocabError",
    "build_o200k_base",
    "ensure_vocab_dir",
    "load_encoding",
]

log = logging.getLogger(__name__)

O200K_BASE_FILE = "o200k_base.tiktoken"
O200K_BASE_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


class VocabError(RuntimeError):
    """The vocabulary could not be found or built, or a file has the wrong hash."""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_o200k_base(target_dir: Path) -> Path:
    """Write ``o200k_base.tiktoken`` into ``target_dir`` from quicktok's binary vocabulary.

    The file is written to a temporary name and moved into place only after its hash matches, so a
    reader never sees a partial or wrong file.
    """
    try:
        raw = resources.files("quicktok").joinpath("data/o200k.vocab").read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise VocabError(
            "quicktok-v1 is not installed; install the 'vocab' extra or set "
            "TIKTOKEN_ENCODINGS_BASE to a directory holding o200k_base.tiktoken"
        ) from exc
    (count,) = struct.unpack_from("<I", raw, 0)
    offset = 4
    entries: list[tuple[int, bytes]] = []
    for _ in range(count):
        (length,) = struct.unpack_from("<H", raw, offset)
        offset += 2
        token = raw[offset : offset + length]
        offset += length
        (rank,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        entries.append((rank, token))
    entries.sort()
    text = b"".join(base64.b64encode(token) + b" %d\n" % rank for rank, token in entries)
    digest = hashlib.sha256(text).hexdigest()
    if digest != O200K_BASE_SHA256:
        raise VocabError(
            f"built o200k_base.tiktoken has sha256 {digest}, expected {O200K_BASE_SHA256}"
        )
    target_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target_dir, prefix=".o200k_base.")
    with os.fdopen(fd, "wb") as out:
        out.write(text)
    os.chmod(tmp, 0o644)
    target = target_dir / O200K_BASE_FILE
    os.replace(tmp, target)
    return target


def _default_cache_dir() -> Path:
    return Path(os.environ.get("RESPONSES_LEDGER_CACHE", ".cache")).resolve() / "tiktoken"


def ensure_vocab_dir(cache_dir: Path | None = None) -> Path | None:
    """Make sure ``TIKTOKEN_ENCODINGS_BASE`` names a directory with a verified vocabulary.

    Returns the directory, or None when none could be provided (harmony will then try to download).
    """
    preset = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
    if preset:
        return Path(preset)
    directory = cache_dir or _default_cache_dir()
    target = directory / O200K_BASE_FILE
    if target.exists():
        digest = _sha256(target)
        if digest != O200K_BASE_SHA256:
            raise VocabError(
                f"{target} has sha256 {digest}, expected {O200K_BASE_SHA256}; refusing to use it"
            )
    else:
        try:
            build_o200k_base(directory)
        except VocabError as exc:
            log.warning("no offline vocabulary: %s", exc)
            return None
        log.info("built %s offline from quicktok-v1", target)
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(directory)
    return directory


@cache
def load_encoding() -> HarmonyEncoding:
    """The ``o200k_harmony`` encoding, loaded once per process."""
    ensure_vocab_dir()
    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
