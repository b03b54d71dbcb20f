"""Turning "what the model is doing" into valid events.

The generation task (through :mod:`domain.decoder`) says *open reasoning*, *append text*, *open a
message with phase*, *open a function call*, *close the item*, *finish with reason*; the
:class:`ResponseBuilder` turns that into the OpenAI stream events, owning ``sequence_number``,
``output_index``, ``content_index`` and id minting. Ids and timestamps come from the caller
(``new_id`` and the ``created_at`` / ``completed_at`` arguments) so the domain stays deterministic.

Every event the builder makes goes through :func:`domain.machine.apply` before it is handed out,
so a builder can never produce a log that the state machine rejects.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from domain.events import (
    CompactionCompacting,
    ContentPartAdded,
    ContentPartDone,
    CustomToolCallInputDelta,
    CustomToolCallInputDone,
    Event,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    Json,
    OutputItemAdded,
    OutputItemDone,
    OutputTextDelta,
    OutputTextDone,
    ReasoningTextDelta,
    ReasoningTextDone,
    ResponseCancelled,
    ResponseCompleted,
    ResponseCreated,
    ResponseFailed,
    ResponseIncomplete,
    ResponseInProgress,
    ResponseQueued,
    copy_json,
)
from domain.machine import INITIAL, LogState, apply, check_log, extend_delta
from domain.projections import fold

__all__ = ["ItemStatus", "Phase", "ResponseBuilder", "TerminalStatus", "Usage", "usage_json"]

Phase = Literal["commentary", "final_answer"]
ItemStatus = Literal["completed", "incomplete"]
TerminalStatus = Literal["completed", "incomplete", "failed", "cancelled"]

_TERMINALS: dict[str, Any] = {
    "completed": ResponseCompleted,
    "incomplete": ResponseIncomplete,
    "failed": ResponseFailed,
    "cancelled": ResponseCancelled,
}


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cache_write_tokens: int = 0


def usage_json(usage: Usage) -> Json:
    """The wire ``usage`` object."""
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.cached_tokens,
            "cache_write_tokens": usage.cache_write_tokens,
        },
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


class _Open:
    """The item being written: its wire dict (as added) and the text chunks of its open part."""

    __slots__ = (
        "content_index",
        "index",
        "item",
        "item_id",
        "kind",
        "logprobs",
        "part_open",
        "text",
        "text_done",
    )

    def __init__(self, item: Json, index: int) -> None:
        self.item = item
        self.item_id: str = item["id"]
        self.kind: str = item["type"]
        self.index = index
        self.content_index = 0
        self.text: list[str] = []  # chunks of the open part (or of the call's input)
        self.logprobs: list[Json] = []  # the open output_text part's entries (domain.logprobs)
        # Only a resumed log can stop between an item's text events; a live one never does.
        self.part_open = self.kind in ("message", "reasoning")
        self.text_done = False


class ResponseBuilder:
    """Builds one response's log. Not thread-safe; one writer per response."""

    def __init__(
        self,
        response: Json,
        *,
        new_id: Callable[[str], str],
        encrypt_reasoning: Callable[[str], str] | None = None,
        coalesce: bool = False,
    ) -> None:
        """``response`` is the Response object as it is at creation (id, created_at, model and
        the echoed request fields); the builder fills in ``status``, ``output``, ``usage`` and the
        outcome fields.

        ``coalesce``: text appended while the delta of the text before it is not yet taken
        joins that delta instead of making one of its own: a writer that takes events only
        when it can hand them to a commit then gets one delta for all the tokens that waited
        for the commit, not one a token (``app.live``). The first text after a take is a delta
        at once, as without ``coalesce``, so a writer that takes after every token pays nothing
        for it."""
        self._response = dict(response)
        self._new_id = new_id
        self._encrypt_reasoning = encrypt_reasoning
        self._state: LogState = INITIAL
        self._pending: list[Event] = []
        self._done_items: list[Json] = []
        self._open: _Open | None = None
        #: (see above; a takeover sets it after replaying a log, ``domain.continuation``)
        self.coalesce = coalesce
        #: (coalesce) The last delta made, while nothing was taken or made after it, and the
        #: text appended since, to join it (``_release``).
        self._joinable: Any = None
        self._held: list[str] = []

    @classmethod
    def resume(
        cls,
        events: Sequence[Event],
        *,
        new_id: Callable[[str], str],
        encrypt_reasoning: Callable[[str], str] | None = None,
        coalesce: bool = False,
    ) -> ResponseBuilder:
        """A builder that continues an existing (non-terminal) log, e.g. to close it."""
        state = check_log(events)
        if state.terminal:
            raise ValueError("the log already ended")
        first = events[0]
        assert isinstance(first, ResponseCreated)
        builder = cls(
            first.response, new_id=new_id, encrypt_reasoning=encrypt_reasoning, coalesce=coalesce
        )
        builder._state = state
        added: dict[int, Json] = {}
        for event in events:
            if isinstance(event, OutputItemAdded):
                added[event.output_index] = event.item
            elif isinstance(event, OutputItemDone):
                builder._done_items.append(copy_json(event.item))
        open_item = state.open_item
        if open_item is not None:
            opened = _Open(copy_json(added[open_item.output_index]), open_item.output_index)
            opened.content_index = max(len(open_item.parts) - 1, 0)
            current = fold(events)["output"][open_item.output_index]
            if opened.kind in ("message", "reasoning"):
                content = current.get("content") or []
                opened.text = [content[-1].get("text", "")] if content else []
                opened.logprobs = list(content[-1].get("logprobs") or []) if content else []
            else:
                opened.text = [
                    current.get("arguments" if opened.kind == "function_call" else "input", "")
                ]
            opened.text_done = open_item.text_done
            if opened.kind in ("message", "reasoning"):
                opened.part_open = open_item.part_open
                # content_part.done ends the part's text too
                opened.text_done = open_item.text_done or not open_item.part_open
                if not open_item.parts:  # added, but no content part yet
                    builder._open = opened
                    builder._open_part(opened)
                    opened.part_open, opened.text_done = True, False
                    return builder
            builder._open = opened
        return builder

    # -- reading ---------------------------------------------------------------------------------

    @property
    def state(self) -> LogState:
        if self._joinable is not None:
            self._release()
        return self._state

    @property
    def open_item_type(self) -> str | None:
        return self._open.kind if self._open else None

    def take(self) -> list[Event]:
        """The events made since the last call, in order."""
        if self._joinable is not None:
            if self._held:
                self._release()
            else:
                self._joinable = None
        events, self._pending = self._pending, []
        return events

    def _emit(self, event: Event) -> None:
        self._state = apply(self._state, event)
        self._pending.append(event)

    @property
    def _seq(self) -> int:
        if self._joinable is not None:  # the next event comes after the held text
            self._release()
        return self._state.next_seq

    def snapshot(self, status: str) -> Json:
        response = copy_json(self._response)
        response["status"] = status
        response["output"] = copy_json(self._done_items)
        return response

    # -- lifecycle -------------------------------------------------------------------------------

    def created(self, *, queued: bool = False) -> None:
        status = "queued" if queued else "in_progress"
        self._emit(ResponseCreated(self._seq, self.snapshot(status)))
        if queued:
            self._emit(ResponseQueued(self._seq, self.snapshot("queued")))

    def in_progress(self) -> None:
        self._emit(ResponseInProgress(self._seq, self.snapshot("in_progress")))

    # -- items -----------------------------------------------------------------------------------

    def _add(self, item: Json) -> _Open:
        if self._open is not None:
            self.close_item()
        opened = _Open(item, len(self._done_items))
        self._open = opened
        self._emit(OutputItemAdded(self._seq, opened.index, copy_json(item)))
        return opened

    def _open_part(self, opened: _Open) -> None:
        part: Json = (
            {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            if opened.kind == "message"
            else {"type": "reasoning_text", "text": ""}
        )
        self._emit(
            ContentPartAdded(self._seq, opened.item_id, opened.index, opened.content_index, part)
        )

    def open_reasoning(self) -> str:
        item: Json = {
            "id": self._new_id("rs"),
            "type": "reasoning",
            "summary": [],
            "content": [],
            "status": "in_progress",
        }
        self._open_part(self._add(item))
        return str(item["id"])

    def open_message(self, phase: Phase = "final_answer") -> str:
        item: Json = {
            "id": self._new_id("msg"),
            "type": "message",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
            "phase": phase,
        }
        self._open_part(self._add(item))
        return str(item["id"])

    def open_function_call(self, name: str, namespace: str | None = None) -> str:
        """Opens a ``function_call`` item; returns its ``call_id``. ``namespace``: the declaring
        ``namespace`` tool, for a function the client declared inside one."""
        item: Json = {
            "id": self._new_id("fc"),
            "type": "function_call",
            "status": "in_progress",
            "call_id": self._new_id("call"),
            "name": name,
            "arguments": "",
        }
        if namespace is not None:
            item["namespace"] = namespace
        self._add(item)
        return str(item["call_id"])

    def open_custom_tool_call(self, name: str) -> str:
        """Opens a ``custom_tool_call`` item; returns its ``call_id``."""
        item: Json = {
            "id": self._new_id("ctc"),
            "type": "custom_tool_call",
            "call_id": self._new_id("call"),
            "name": name,
            "input": "",
        }
        self._add(item)
        return str(item["call_id"])

    def open_compaction(self) -> str:
        """Opens a ``compaction`` item (no content until :meth:`close_compaction`); returns its id."""
        item: Json = {"id": self._new_id("cmp"), "type": "compaction"}
        self._add(item)
        return str(item["id"])

    def compacting(self) -> None:
        """``response.compaction.compacting``: the summary of the open compaction item is being
        written (the event carries none of it)."""
        opened = self._open
        if opened is None or opened.kind != "compaction":
            raise ValueError("compacting() needs an open compaction item")
        self._emit(CompactionCompacting(self._seq, opened.item_id, opened.index))

    def close_compaction(self, encrypted_content: str) -> Json:
        """Closes the open ``compaction`` item with its sealed summary."""
        opened = self._open
        if opened is None or opened.kind != "compaction":
            raise ValueError("close_compaction() needs an open compaction item")
        opened.item = {**opened.item, "encrypted_content": encrypted_content}
        item = self.close_item()
        assert item is not None
        return item

    def append(self, text: str) -> None:
        """Append text to the open item: message text, reasoning text, call arguments or input."""
        if not text:
            return
        if "\x00" in text:  # PostgreSQL's JSONB cannot hold U+0000; the ledger stores U+FFFD
            text = text.replace("\x00", "\ufffd")
        opened = self._open
        if opened is None:
            raise ValueError("append() with no open item")
        opened.text.append(text)
        if self._joinable is not None:  # (coalesce) joins the delta not yet taken
            self._held.append(text)
            return
        seq = self._state.next_seq
        kind = opened.kind
        event: Event
        if kind == "message":
            event = OutputTextDelta(seq, opened.item_id, opened.index, opened.content_index, text)
        elif kind == "reasoning":
            event = ReasoningTextDelta(
                seq, opened.item_id, opened.index, opened.content_index, text
            )
        elif kind == "function_call":
            event = FunctionCallArgumentsDelta(seq, opened.item_id, opened.index, text)
        else:
            event = CustomToolCallInputDelta(seq, opened.item_id, opened.index, text)
        self._state = apply(self._state, event)
        self._pending.append(event)
        if self.coalesce:
            self._joinable = event

    def _release(self) -> None:
        """The held text joins the delta it follows (see ``coalesce``): one event, its seq."""
        event, held = self._joinable, self._held
        self._joinable = None
        if not held:
            return
        text = held[0] if len(held) == 1 else "".join(held)
        held.clear()
        assert self._pending[-1] is event  # (anything made after it released the text first)
        self._state = extend_delta(self._state, text)
        e: Any = event  # made here, not by dataclasses.replace: four times cheaper
        cls = type(e)
        if (
            cls is OutputTextDelta or cls is ReasoningTextDelta
        ):  # (never with logprobs: append_text)
            joined = cls(
                e.sequence_number, e.item_id, e.output_index, e.content_index, e.delta + text
            )
        else:
            joined = cls(e.sequence_number, e.item_id, e.output_index, e.delta + text)
        self._pending[-1] = joined

    def append_text(self, text: str, logprobs: Sequence[Json]) -> None:
        """Append message text with the log probabilities of the tokens that made it (the
        entries of :mod:`domain.logprobs`); the part's ``.done`` carries them all."""
        opened = self._open
        if opened is None or opened.kind != "message":
            raise ValueError("append_text() needs an open message")
        if not text:
            return
        if "\x00" in text:
            text = text.replace("\x00", "\ufffd")
        if self._joinable is not None:  # (a decoder with logprobs appends a message's text here)
            self._release()
        opened.text.append(text)
        opened.logprobs.extend(logprobs)
        event = OutputTextDelta(
            self._state.next_seq,
            opened.item_id,
            opened.index,
            opened.content_index,
            text,
            tuple(logprobs),
        )
        self._state = apply(self._state, event)
        self._pending.append(event)

    def carry_logprobs(self, logprobs: Sequence[Json]) -> None:
        """The open message's entries so far, when it was rebuilt from tokens alone (a takeover
        replaying a log whose deltas carried them)."""
        if self._open is not None and self._open.kind == "message":
            self._open.logprobs = list(logprobs)

    def close_item(self, status: ItemStatus = "completed") -> Json | None:
        """Close the open item (no-op when none is open); returns the finished item."""
        opened = self._open
        if opened is None:
            return None
        text = "".join(opened.text)
        seq = self._seq
        item = dict(opened.item)
        if opened.kind in ("message", "reasoning"):
            ci = opened.content_index
            if opened.kind == "message":
                logprobs = opened.logprobs
                part: Json = {
                    "type": "output_text",
                    "text": text,
                    "annotations": [],
                    "logprobs": logprobs,
                }
                if not opened.text_done:
                    self._emit(
                        OutputTextDone(seq, opened.item_id, opened.index, ci, text, tuple(logprobs))
                    )
            else:
                part = {"type": "reasoning_text", "text": text}
                if not opened.text_done:
                    self._emit(ReasoningTextDone(seq, opened.item_id, opened.index, ci, text))
            if opened.part_open:
                self._emit(ContentPartDone(self._seq, opened.item_id, opened.index, ci, part))
            item["content"] = [part]
            item["status"] = status
            if opened.kind == "reasoning" and self._encrypt_reasoning is not None:
                item["encrypted_content"] = self._encrypt_reasoning(text)
        elif opened.kind == "function_call":
            if not opened.text_done:
                self._emit(
                    FunctionCallArgumentsDone(
                        seq, opened.item_id, opened.index, text, str(item["name"])
                    )
                )
            item["arguments"] = text
            item["status"] = status
        elif opened.kind == "compaction":
            item.setdefault("encrypted_content", "")  # cut off before it was sealed: empty
        else:
            if not opened.text_done:
                self._emit(CustomToolCallInputDone(seq, opened.item_id, opened.index, text))
            item["input"] = text
        self._open = None
        self._done_items.append(item)
        self._emit(OutputItemDone(self._seq, opened.index, copy_json(item)))
        return item

    # -- the end ---------------------------------------------------------------------------------

    def finish(
        self,
        status: TerminalStatus,
        *,
        usage: Usage | None,
        completed_at: int | None = None,
        error: Json | None = None,
        incomplete_reason: str | None = None,
    ) -> Json:
        """Close any open item and append the one terminal event; returns the final Response.

        An item cut off by anything but success is closed ``incomplete``.
        """
        self.close_item("completed" if status == "completed" else "incomplete")
        response = self.snapshot(status)
        response["usage"] = usage_json(usage) if usage is not None else None
        if status == "completed":
            response["completed_at"] = completed_at
        if status == "failed":
            response["error"] = error or {"code": "server_error", "message": "generation failed"}
        if status == "incomplete":
            response["incomplete_details"] = {"reason": incomplete_reason or "max_output_tokens"}
        self._emit(_TERMINALS[status](self._seq, response))
        return response
