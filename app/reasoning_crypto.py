"""Encrypted reasoning: ``include: ["reasoning.encrypted_content"]`` and its replay.

Clients that keep no server state (``store: false``, e.g. the Codex CLI) replay earlier reasoning
items with their ``encrypted_content``. Upstream servers only compressed and base64-encoded the
text, so anyone could read or forge it. Here the blob is real authenticated encryption:

``"rlr1." + urlsafe_b64(nonce(12) || AES-256-GCM(key, nonce, zlib(text), aad))``

- the key comes from configuration, or is generated once and kept in the database (so restarts
  and replicas agree);
- the AAD binds the blob to its purpose and version, so a blob made for anything else fails
  (a compaction item's ``encrypted_content``, :mod:`app.compaction`, is sealed by the same cipher
  for the purpose ``COMPACTION``: a reasoning blob cannot pass for a compaction, nor the reverse);
- decompression is bounded (``MAX_PLAINTEXT`` bytes) so a small blob cannot expand without limit;
- any failure (foreign, tampered, truncated, oversized) raises :class:`InvalidEncryptedContent`,
  which the API answers with 400 ``invalid_encrypted_content``.
"""

from __future__ import annotations

import base64
import binascii
import os
import zlib

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from domain.errors import InvalidInput

__all__ = [
    "COMPACTION",
    "MAX_PLAINTEXT",
    "REASONING",
    "InvalidEncryptedContent",
    "ReasoningCipher",
    "new_key",
]

PREFIX = "rlr1."
#: What a blob was sealed for (its AAD).
REASONING = b"responses-ledger/reasoning/v1"
COMPACTION = b"responses-ledger/compaction/v1"
MAX_PLAINTEXT = 1 << 20  # 1 MiB of reasoning text per item
_MAX_BLOB = 4 * MAX_PLAINTEXT


class InvalidEncryptedContent(InvalidInput):
    def __init__(self, why: str) -> None:
        super().__init__(
            f"The encrypted content could not be verified or decrypted: {why}.",
            param="input",
            code="invalid_encrypted_content",
        )


def new_key() -> bytes:
    return AESGCM.generate_key(bit_length=256)


class ReasoningCipher:
    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise ValueError("the reasoning key must be 32 bytes")
        self._aead = AESGCM(key)

    def encrypt(self, text: str, purpose: bytes = REASONING) -> str:
        nonce = os.urandom(12)
        sealed = self._aead.encrypt(nonce, zlib.compress(text.encode("utf-8")), purpose)
        return PREFIX + base64.urlsafe_b64encode(nonce + sealed).decode("ascii")

    def decrypt(self, blob: str, purpose: bytes = REASONING) -> str:
        if not isinstance(blob, str) or not blob.startswith(PREFIX):
            raise InvalidEncryptedContent("it was not issued by this server")
        if len(blob) > _MAX_BLOB:
            raise InvalidEncryptedContent("it is too large")
        try:
            raw = base64.urlsafe_b64decode(blob[len(PREFIX) :].encode("ascii"))
        except (binascii.Error, UnicodeEncodeError, ValueError):
            raise InvalidEncryptedContent("it is not valid base64") from None
        if len(raw) < 12 + 16:
            raise InvalidEncryptedContent("it is truncated")
        try:
            compressed = self._aead.decrypt(raw[:12], raw[12:], purpose)
        except InvalidTag:
            raise InvalidEncryptedContent("it was modified or made with another key") from None
        inflater = zlib.decompressobj()
        try:
            plain = inflater.decompress(compressed, MAX_PLAINTEXT)
        except zlib.error:
            raise InvalidEncryptedContent("its payload is corrupt") from None
        if inflater.unconsumed_tail or not inflater.eof:
            raise InvalidEncryptedContent("its payload is larger than allowed")
        try:
            return plain.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidEncryptedContent("its payload is not text") from None
