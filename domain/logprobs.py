"""Per-token log probabilities in OpenAI's shape (``include: ["message.output_text.logprobs"]``).

An engine gives, per output token, ``(logprob, [(token id, logprob), ...])``: the sampled token's
log probability and the top-k at its position, most likely first. :class:`TokenTexts` turns that
into the JSON of ``openai.types.responses.ResponseOutputText.Logprob``::

    {"token": str, "bytes": [int], "logprob": float,
     "top_logprobs": [{"token": str, "bytes": [int], "logprob": float}, ...]}

``bytes`` are the token's exact bytes in o200k_harmony; ``token`` is them decoded as UTF-8 with
U+FFFD for what is not valid on its own (a token holding part of a multi-byte character), and
U+0000 written U+FFFD as the ledger writes it in text (PostgreSQL's JSONB cannot hold it). A log
probability that is not a finite number (``-inf`` for a token the engine ruled out) is written
``-9999.0``, as OpenAI does: JSON has no infinities.

Which delta carries which token (see :class:`~domain.decoder.HarmonyDecoder`): a token's entry
goes on the first ``output_text`` delta at or after it. Harmony holds back the bytes of an
incomplete UTF-8 character, so a token that ends inside a character produces no delta; its entry
rides on the delta that completes the character. Tokens that never produce text (special tokens
inside content, a character left incomplete when the message ends) have no entry. So the
concatenated ``bytes`` of a part's entries equal its text's UTF-8 whenever the model wrote valid
UTF-8. Where it did not, Harmony's lossy decoding writes U+FFFD and may hold back the text of the
next token or two (a token after an invalid sequence can show up a delta late, or be lost at the
message's end); the entries follow the tokens, so they can then sit one delta ahead of the text.
The ``.done`` event and the finished part carry the concatenation of the deltas' entries.
Reasoning, function-call arguments and custom tool input carry none (OpenAI's API has no
logprobs for them); nor does text recovered from malformed output, which is no longer aligned
with its tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from domain.events import Json

__all__ = ["FLOOR", "TokenLogprob", "TokenTexts"]

#: What an engine gives per output token: its log probability and the top-k
#: ``(token id, logprob)`` at its position, most likely first.
TokenLogprob = tuple[float, Sequence[tuple[int, float]]]

#: What a log probability that is not finite (``-inf``, NaN) is written as.
FLOOR = -9999.0


def _finite(value: float) -> float:
    return value if value >= FLOOR else FLOOR  # False for NaN as for -inf


class TokenTexts:
    """Token id -> (text, bytes), cached (a token's top-k repeat across positions and requests)."""

    def __init__(self, decode_bytes: Callable[[list[int]], bytes]) -> None:
        self._decode_bytes = decode_bytes
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def _text(self, token_id: int) -> tuple[str, list[int]]:
        known = self._cache.get(token_id)
        if known is None:
            raw = bytes(self._decode_bytes([token_id]))
            text = raw.decode("utf-8", errors="replace").replace("\x00", "\ufffd")
            known = (text, list(raw))
            if len(self._cache) < 1 << 18:
                self._cache[token_id] = known
        return known

    def entry(self, token_id: int, logprob: float, top: Sequence[tuple[int, float]]) -> Json:
        """The ``Logprob`` JSON of one sampled token and its top-k."""
        text, raw = self._text(token_id)
        tops: list[Json] = []
        for other, value in top:
            other_text, other_raw = self._text(other)
            tops.append({"token": other_text, "bytes": list(other_raw), "logprob": _finite(value)})
        return {
            "token": text,
            "bytes": list(raw),
            "logprob": _finite(logprob),
            "top_logprobs": tops,
        }
