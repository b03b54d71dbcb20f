"""Compaction, the pure parts: the summarisation prompt, where a compaction happens, what it keeps.

A compaction replaces a conversation's context by a summary **the model writes itself**: the
context is rendered as it would be for the next turn, followed by one more user message,
:data:`SUMMARY_PROMPT`, with no tools offered, and the model's final answer to it is the summary.
Nothing here cuts or truncates text; a model that writes no final answer makes no compaction
(:func:`summary_of` raises). The orchestration (engine, sealing, the log) is ``app.compaction``.

The summary travels sealed in a ``compaction`` item's ``encrypted_content`` (AES-GCM under the
server key, ``app.reasoning_crypto``), and is rendered back (:data:`SUMMARY_HEADER`) as a user
message where the item stands. The latest ``compaction`` item of a prompt stands for everything
before it except the user messages, which OpenAI's compacted output keeps verbatim
(:func:`superseded`): a client may send its whole history with the compaction item in it,
or only what the compacted output gave it, and the model sees the same context.

Decisions where OpenAI documents no rule:

- a ``compaction_trigger`` input item must be the last one (as the SDK says); anywhere else it
  is a 400, and it never renders;
- the summary is the text of the model's last ``final`` message; analysis is never a summary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from domain.errors import InvalidInput

__all__ = [
    "COMPACTION",
    "SUMMARY_GRAMMAR",
    "SUMMARY_HEADER",
    "SUMMARY_PROMPT",
    "TRIGGER",
    "NoSummary",
    "compaction_item",
    "kept_user_messages",
    "split_trigger",
    "summarisation_items",
    "summary_of",
    "superseded",
]

COMPACTION = "compaction"
TRIGGER = "compaction_trigger"

#: The user message that asks the model for the summary (appended after the context).
SUMMARY_PROMPT = (
    "Context compaction: the conversation above is about to be replaced by a summary that you "
    "write now, and the work will continue from that summary alone. Write it for yourself, so "
    "that you can go on without the original. Include: the user's goals and requests, and any "
    "constraints or preferences they stated; decisions made and why; what has been done so far "
    "(tool calls made and what they returned, files or data touched, results); open questions "
    "and what remains to do, in order; exact names, identifiers, numbers, paths and code that "
    "later steps need. Leave out pleasantries and anything no later step needs. Write only the "
    "summary, in plain prose or short lists, without addressing the user."
)

#: How a compaction item's summary opens when it is rendered back into a prompt.
SUMMARY_HEADER = (
    "Summary of the conversation so far (you wrote it when the earlier context was compacted; "
    "continue from it):\n\n"
)


#: On an engine that enforces grammars (vLLM), the summarisation turn is held to Harmony's shape
#: for it: at most one free ``analysis`` message, then the ``final`` message, whose text must hold
#: something other than whitespace. The model cannot end the turn without writing a summary, nor
#: call a tool; what the summary says stays the model's.
SUMMARY_GRAMMAR = "\n".join(
    (
        "start: analysis? final",
        'analysis: <|channel|> "analysis" <|message|> TEXT <|end|> <|start|> "assistant"',
        'final: <|channel|> "final" <|message|> SUMMARY <|return|>',
        "TEXT: /(?s:.*)/",
        r"SUMMARY: /(?s:\s*\S.*)/",
    )
)


class NoSummary(Exception):
    """The model's answer to the summarisation prompt held no final message."""


_Item = TypeVar("_Item", bound=Mapping[str, Any])


def split_trigger(items: Sequence[_Item]) -> tuple[list[_Item], bool]:
    """``items`` without a final ``compaction_trigger``, and whether there was one. A trigger
    anywhere but last is :class:`InvalidInput` naming it."""
    found = [
        i
        for i, item in enumerate(items)
        if isinstance(item, Mapping) and item.get("type") == TRIGGER
    ]
    if not found:
        return list(items), False
    last = len(items) - 1
    for index in found:
        if index != last:
            raise InvalidInput(
                "A compaction_trigger item must be the final input item.",
                param=f"input[{index}].type",
            )
    return list(items[:last]), True


def summarisation_items(items: Sequence[Any]) -> list[Any]:
    """The conversation the model summarises: ``items`` then :data:`SUMMARY_PROMPT`."""
    return [*items, {"type": "message", "role": "user", "content": SUMMARY_PROMPT}]


def summary_of(output: Sequence[Mapping[str, Any]]) -> str:
    """The summary in the model's output items (as the response builder made them): the text of
    its last assistant message that is not a commentary preamble."""
    for item in reversed(output):
        if item.get("type") != "message" or item.get("phase") == "commentary":
            continue
        text = "".join(
            str(part.get("text", ""))
            for part in item.get("content") or ()
            if isinstance(part, Mapping)
        ).strip()
        if text:
            return text
    raise NoSummary("the model wrote no final answer to the summarisation prompt")


def _is_user_message(item: Mapping[str, Any]) -> bool:
    return item.get("role") == "user" and item.get("type", "message") == "message"


def kept_user_messages(items: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The user messages of ``items``, in order: what a compacted output keeps verbatim before
    its compaction item (an earlier compaction item's summary is in the new one)."""
    return [item for item in items if isinstance(item, Mapping) and _is_user_message(item)]


def superseded(items: Sequence[Any]) -> frozenset[int]:
    """The indices of ``items`` a prompt does not render: before the latest ``compaction`` item,
    everything but the user messages (its summary stands for the rest)."""
    latest = max(
        (
            i
            for i, item in enumerate(items)
            if isinstance(item, Mapping) and item.get("type") == COMPACTION
        ),
        default=-1,
    )
    return frozenset(
        i
        for i in range(max(latest, 0))
        if not (isinstance(items[i], Mapping) and _is_user_message(items[i]))
    )


def compaction_item(item_id: str, encrypted_content: str) -> dict[str, Any]:
    """A ``compaction`` output item (the SDK's ``ResponseCompactionItem``)."""
    return {"id": item_id, "type": COMPACTION, "encrypted_content": encrypted_content}
