"""``include: ["message.output_text.logprobs"]`` and ``top_logprobs``: what a request asks of the
engine, and the token texts that turn the engine's ids into OpenAI's ``logprobs`` entries.

The include value switches them on; ``top_logprobs`` (0..20, default 0) is how many of the most
likely tokens each entry lists. ``top_logprobs`` without the include value is echoed and changes
nothing, as with OpenAI. An engine whose tokens are not sampled from a distribution (echo,
scripted) has no log probabilities to give: asking it for them is a 400, not an empty list.
Which deltas carry which entries: :mod:`domain.logprobs`.
"""

from __future__ import annotations

from functools import cache

from openai_harmony import HarmonyEncoding

from app.engines.protocol import Engine
from app.errors import APIError
from app.wire import CreateResponse
from domain.logprobs import TokenTexts

__all__ = ["INCLUDE_LOGPROBS", "requested_logprobs", "token_texts"]

INCLUDE_LOGPROBS = "message.output_text.logprobs"


def requested_logprobs(request: CreateResponse, engine: Engine) -> int | None:
    """``Sampling.logprobs`` for ``request``: None when it does not include them, else the number
    of top tokens per position. Raises a 400 when the engine cannot give them."""
    if INCLUDE_LOGPROBS not in (request.include or ()):
        return None
    if not getattr(engine, "supports_logprobs", False):
        raise APIError(
            400,
            f"include '{INCLUDE_LOGPROBS}' is not supported by this server's engine "
            f"({type(engine).__name__}): its tokens are not sampled, so it has no log "
            "probabilities. Serve a model with the vLLM engine to get them.",
            param="include",
            code="unsupported_value",
        )
    return request.top_logprobs or 0


@cache
def token_texts(encoding: HarmonyEncoding) -> TokenTexts:
    """One token-text cache per encoding (in practice one per process)."""
    inner = getattr(encoding, "_inner", encoding)  # the Rust object has decode_bytes
    return TokenTexts(inner.decode_bytes)
