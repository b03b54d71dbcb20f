"""The prompt of a request: what ``POST /v1/responses`` (and ``input_tokens``, ``compact``,
WebSocket mode's pre-warm) sends the engine, and how it is sampled.

- ``normalize_input``: the request's input as stored and listed (every item with an id).
- ``Prompts.prompt``: the history (a ``previous_response_id`` chain replayed from the store, or
  a ``conversation``'s items), the input, its ``item_reference`` items resolved
  (``app.item_refs``), rendered as Harmony tokens (``domain.prompt``), with ``truncation:
  "auto"`` applied (``domain.truncation``).
- ``Prompts.sampling``: the engine's sampling parameters, and the last checks before
  generating (the context window, ``text.format``'s grammar: ``app.constraints``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from app import constraints, item_refs, offload
from app.chunked_render import ChunkedEncoding, is_panic, text_size_over
from app.conversations import Conversations
from app.engines.protocol import Engine, EngineError, PromptTooLong, Sampling
from app.errors import APIError
from app.ids import new_id
from app.logprobs import requested_logprobs
from app.wire import CreateResponse
from domain.compaction import split_trigger
from domain.events import TERMINAL_TYPES, copy_json
from domain.projections import output_as_input
from domain.prompt import PromptRequest, RenderedPrompt, render_prompt
from domain.truncation import Truncated, fit
from persistence.errors import NotFound
from persistence.store import EventStore

__all__ = ["Prompts", "normalize_input", "render_checked"]

log = logging.getLogger(__name__)

#: Prompts with more characters of text than this are rendered off the event loop.
_LARGE_PROMPT_CHARS = 64 * 1024


def normalize_input(value: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request's input as stored and listed by ``input_items``: a list of items, each with an
    ``id``; a string becomes one user message; messages get ``"type": "message"``, a ``status``
    and their content as a list of parts (``input_text``, or ``output_text`` for the assistant),
    the shape OpenAI lists them in. ``domain.prompt`` renders both shapes identically.
    """
    if isinstance(value, str):
        value = [{"type": "message", "role": "user", "content": value}]
    prefixes = {
        "message": "msg",
        "function_call_output": "fco",
        "custom_tool_call_output": "ctco",
        "compaction": "cmp",
        "compaction_trigger": "cmpt",
    }
    items: list[dict[str, Any]] = []
    for original in value:
        item = copy_json(original)  # (JSON from the request: copy.deepcopy's memo is not needed)
        if "type" not in item and "role" in item:
            item["type"] = "message"
        if item.get("type") == "message":
            if isinstance(item.get("content"), str):
                part = "output_text" if item.get("role") == "assistant" else "input_text"
                extra: dict[str, list[Any]] = {"annotations": []} if part == "output_text" else {}
                item["content"] = [{"type": part, "text": item["content"], **extra}]
            item.setdefault("status", "completed")
        if not item.get("id"):
            item["id"] = new_id(prefixes.get(str(item.get("type")), "item"))
        items.append(item)
    return items


class Prompts:
    """Builds the prompts of one server's requests (see the module docstring)."""

    def __init__(
        self,
        store: EventStore,
        engine: Engine,
        encoding: Any,
        conversations: Conversations,
        *,
        default_effort: str,
        decrypt: Callable[[str], str],
        open_compaction: Callable[[str], str],
    ) -> None:
        self._store = store
        self._engine = engine
        self._encoding = encoding
        self._conversations = conversations
        self._default_effort = default_effort
        self._decrypt = decrypt
        self._open_compaction = open_compaction

    async def prompt(
        self, request: CreateResponse, project: str, conversation: str | None = None
    ) -> tuple[list[dict[str, Any]], RenderedPrompt, Truncated[RenderedPrompt] | None]:
        """The request's input items (normalised) and its prompt, rendered with its
        ``previous_response_id`` chain or its ``conversation``'s items, and its item references
        (``app.item_refs``), and what ``truncation: "auto"`` dropped: what ``create`` generates
        from, and what ``app.input_tokens`` counts."""
        history: list[dict[str, Any]] = []
        if request.previous_response_id:
            history = await self.history(request.previous_response_id, project)
        elif conversation:
            history = await self._conversations.history(conversation, project)
        input_items = normalize_input(request.input)
        context, _ = split_trigger(
            input_items
        )  # a final compaction_trigger is acted on, not rendered
        references = await item_refs.resolve(self._store, project, [*history, *context])
        rendered, truncated = await self.render(request, history, context, references)
        return input_items, rendered, truncated

    async def history(self, previous_response_id: str, project: str) -> list[dict[str, Any]]:
        try:
            chain = await self._store.load_chain(previous_response_id, project=project)
        except NotFound:
            raise APIError(
                404,
                f"Previous response with id '{previous_response_id}' not found.",
                param="previous_response_id",
                code="previous_response_not_found",
            ) from None
        items: list[dict[str, Any]] = []
        for link in chain:
            items.extend(link.input_items)
            terminal = next((e for e in reversed(link.events) if e.type in TERMINAL_TYPES), None)
            if terminal is not None:
                output = terminal.payload["response"].get("output", [])
            else:  # still generating: what has finished so far
                output = [
                    e.payload["item"] for e in link.events if e.type == "response.output_item.done"
                ]
            items.extend(output_as_input(item) for item in output)
        return items

    async def render(
        self,
        request: CreateResponse,
        history: list[dict[str, Any]],
        input_items: list[dict[str, Any]],
        references: dict[str, dict[str, Any]],
    ) -> tuple[RenderedPrompt, Truncated[RenderedPrompt] | None]:
        """The prompt, with every token id checked against the engine's vocabulary. A large one
        (over ``_LARGE_PROMPT_CHARS`` of text) is rendered in a worker thread, its long texts in
        short Harmony calls (:mod:`app.chunked_render`): Harmony holds the GIL while it works, so
        an 8 MB message rendered in one call stalled every stream for 0.6 s.

        With ``truncation: "auto"``, a prompt that does not fit the context loses its oldest
        items (:mod:`domain.truncation`); what was dropped comes back with it."""
        effort = (request.reasoning.effort if request.reasoning else None) or self._default_effort
        prompt_items = [*history, *input_items]
        prompt = PromptRequest(
            instructions=request.instructions,
            items=prompt_items,
            tools=request.tools,
            tool_choice=request.tool_choice,
            reasoning_effort=effort,
            current_date=datetime.now(UTC).strftime("%Y-%m-%d"),
            history_length=len(history),
            decrypt=self._decrypt,
            decrypt_compaction=self._open_compaction,
            resolve_reference=references.get,
            response_format=(request.text or {}).get("format"),
        )
        vocab_size = self._engine.vocab_size
        large = text_size_over(
            (request.instructions, request.tools, history, input_items), _LARGE_PROMPT_CHARS
        )
        encoding: Any = ChunkedEncoding(self._encoding) if large else self._encoding
        render = functools.partial(render_checked, encoding, vocab_size=vocab_size)
        rendered = await offload.run(render, prompt) if large else render(prompt)
        fits = functools.partial(self._fits, request.max_output_tokens)
        if request.truncation != "auto" or fits(rendered):
            return rendered, None

        def measure(items: Sequence[Any], history_length: int) -> RenderedPrompt:
            return render(dataclasses.replace(prompt, items=items, history_length=history_length))

        search = functools.partial(
            fit, prompt_items, len(history), measure, fits, resolve=references.get
        )
        truncated = await offload.run(search) if large else search()
        if truncated is None:  # not even the last item alone fits: context_length_exceeded
            return rendered, None
        return truncated.result, truncated

    def _fits(self, max_tokens: int | None, rendered: RenderedPrompt) -> bool:
        limit = self._engine.max_model_len
        prompt_len = len(rendered.token_ids)
        return limit is None or (
            prompt_len < limit and (max_tokens is None or prompt_len + max_tokens <= limit)
        )

    def sampling(
        self, request: CreateResponse, rendered: RenderedPrompt, prompt_len: int
    ) -> Sampling:
        max_tokens = request.max_output_tokens
        if not self._fits(max_tokens, rendered):
            assert self._engine.max_model_len is not None
            raise PromptTooLong(prompt_len, max_tokens, self._engine.max_model_len)
        return Sampling(
            max_tokens=max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed,
            presence_penalty=request.presence_penalty,
            frequency_penalty=request.frequency_penalty,
            stop_token_ids=rendered.stop_token_ids,
            grammar=constraints.grammar_for(
                (request.text or {}).get("format"), rendered, self._engine.constrains
            ),
            logprobs=requested_logprobs(request, self._engine),
        )


def render_checked(encoding: Any, prompt: PromptRequest, vocab_size: int) -> RenderedPrompt:
    """``render_prompt``, with a panic inside openai-harmony (pyo3's ``PanicException``, a
    ``BaseException``) answered as a 400 about the input rather than escaping every handler,
    and every token id checked against the engine's vocabulary."""
    try:
        rendered = render_prompt(encoding, prompt)
    except BaseException as exc:
        if not is_panic(exc):
            raise
        log.warning("openai-harmony panicked rendering a prompt: %s", exc)
        raise APIError(
            400,
            f"The input could not be tokenized: the tokenizer failed on it ({exc}).",
            param="input",
            code="invalid_prompt",
        ) from None
    ids = rendered.token_ids
    for start in range(0, len(ids), 1 << 16):  # C loops, in slices: each holds the GIL briefly
        piece = ids[start : start + (1 << 16)]
        if min(piece) < 0 or max(piece) >= vocab_size:
            token = next(t for t in piece if not 0 <= t < vocab_size)
            raise EngineError(f"prompt token id {token} is outside the vocabulary")
    return rendered
