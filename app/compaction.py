"""Compaction: ``POST /v1/responses/compact``, ``compaction_trigger`` and ``context_management``.

The summary is written by the model, through the engine (``domain.compaction`` holds the
summarisation prompt and the rules): the context is rendered as the next turn would be, without
tools offered, followed by :data:`~domain.compaction.SUMMARY_PROMPT`; the model's final answer is
the summary. It is sealed with the server key by the reasoning cipher (``app.reasoning_crypto``,
purpose ``COMPACTION``) into a ``compaction`` item's ``encrypted_content``; replayed, it is
decrypted and rendered back (``domain.prompt``), and one that does not verify is a 400.

Three ways in:

- ``POST /v1/responses/compact`` (SDK ``responses.compact``): a ``CompactedResponse`` whose output
  is the user messages of the context, then one compaction item. Nothing is stored (OpenAI's
  ``compact`` has no ``store``); the caller sends the output back as the next turn's input.
- a final ``compaction_trigger`` input item on ``POST /v1/responses`` (Codex's remote compaction
  v2): the response's output is exactly one compaction item of the context before the trigger,
  streamed as ``output_item.added``, ``response.compaction.compacting`` (once the engine samples
  the summary) and ``output_item.done``; no answer is generated.
- ``context_management: [{"type": "compaction", "compact_threshold": N}]``: when the rendered
  prompt has more than N tokens, the response's first output item is a compaction item, and the
  answer is generated from the compacted context (the user messages and the summary).

In a response the compaction is part of its log (``output_item.added`` / ``.done`` of the item),
and, when stored, its audit records hold the summarisation prompt's and the summary's token ids
(``compaction_prompt_token_ids``, ``compaction_output_token_ids``). ``store: false`` compacts the
same way and keeps nothing.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from app import item_refs
from app.contract import check_request
from app.engines.protocol import EngineError, PromptTooLong, Sampling
from app.errors import APIError, unknown_parameter
from app.reasoning_crypto import COMPACTION
from app.wire import CreateResponse
from domain.builder import ResponseBuilder, Usage, usage_json
from domain.compaction import (
    SUMMARY_GRAMMAR,
    TRIGGER,
    NoSummary,
    compaction_item,
    kept_user_messages,
    split_trigger,
    summarisation_items,
    summary_of,
)
from domain.decoder import HarmonyDecoder
from domain.errors import InvalidInput
from domain.prompt import RenderedPrompt
from persistence.records import AuditRecord

if TYPE_CHECKING:
    from app.live import LogWriter, Run
    from app.service import ResponseService

__all__ = ["COMPACT_FIELDS", "Compactions", "Plan", "Step", "Summary"]

#: The body fields of openai-python 3.57's ``ResponseCompactParams``, and those the Codex CLI's
#: compaction request adds (``codex-api``'s ``CompactionInput``: the turn's ``tools``,
#: ``parallel_tool_calls``, ``reasoning`` and ``text``).
COMPACT_FIELDS = frozenset(
    {
        "image",
        "input",
        "instructions",
        "model",
        "previous_response_id",
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "service_tier",
        "tools",
        "parallel_tool_calls",
        "reasoning",
        "text",
    }
)
#: What ``compact`` takes as create takes it (checked by the same contract and wire model):
#: the tools are declared to the summarisation prompt (not offered), so that earlier calls render
#: as they did; ``reasoning.effort`` is the summary's; ``text`` is checked and does not bind the
#: summary (free text).
_AS_CREATE = (
    "model",
    "input",
    "instructions",
    "previous_response_id",
    "tools",
    "parallel_tool_calls",
    "reasoning",
    "text",
    "service_tier",
    "prompt_cache_key",
    "prompt_cache_retention",
)
#: Most tokens the model may spend on a summary (its reasoning included); fewer when the context
#: window has less room left after the summarisation prompt.
SUMMARY_MAX_TOKENS = 4096


def _invalid(param: str, message: str, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


@dataclasses.dataclass(frozen=True)
class Summary:
    """What one summarisation gave: the summary, and the engine's work for the audit."""

    text: str
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    finish_reason: str
    usage: Usage


@dataclasses.dataclass(frozen=True)
class Plan:
    """A compaction a response makes before (or instead of) its answer."""

    request: CreateResponse
    #: The context to compact (history and input, without the trigger).
    context: list[dict[str, Any]]
    #: A ``compaction_trigger``: the compaction item is the whole output.
    only: bool
    project: str


@dataclasses.dataclass(frozen=True)
class Step:
    """The compaction done inside a response: what the answer is generated from next."""

    usage: Usage
    #: Why the compaction failed (the response then ends with it), or None.
    error: str | None = None
    #: The engine's finish reason when it failed: ``abort`` (a cancel, a drain) or ``error``.
    finish_reason: str = "error"
    prompt: RenderedPrompt | None = None
    sampling: Sampling | None = None


class Compactions:
    """Compaction for one service (its engine, encoding, cipher and renderer)."""

    def __init__(self, service: ResponseService, *, new_id: Callable[[str], str]) -> None:
        self._service = service
        self._new_id = new_id

    # -- sealing ---------------------------------------------------------------------------------

    def seal(self, summary: str) -> str:
        return self._service.cipher.encrypt(summary, COMPACTION)

    def open(self, blob: str) -> str:
        return self._service.cipher.decrypt(blob, COMPACTION)

    # -- the summary -----------------------------------------------------------------------------

    async def summarise(
        self,
        request: CreateResponse,
        context: list[dict[str, Any]],
        request_id: str,
        *,
        project: str,
        sampled: Callable[[], None] | None = None,
    ) -> Summary:
        """The model's summary of ``context`` (rendered with ``request``'s instructions, tools
        declared but not offered, and reasoning effort). :class:`NoSummary` when it wrote none;
        the engine's errors as they come. ``sampled`` is called when the first tokens come."""
        service = self._service
        asked = request.model_copy(update={"tool_choice": "none", "text": None, "truncation": None})
        references = await item_refs.resolve(service.store, project, context)
        rendered, _ = await service.prompts.render(
            asked, [], summarisation_items(context), references
        )
        prompt_len = len(rendered.token_ids)
        limit = service.engine.max_model_len
        room = SUMMARY_MAX_TOKENS if limit is None else min(SUMMARY_MAX_TOKENS, limit - prompt_len)
        if room < 1:
            assert limit is not None
            raise PromptTooLong(prompt_len, None, limit)
        sampling = Sampling(
            max_tokens=room,
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed,
            stop_token_ids=rendered.stop_token_ids,
            grammar=SUMMARY_GRAMMAR if service.engine.constrains else None,
        )
        output: list[int] = []
        finish_reason: str | None = None
        async for chunk in service.engine.generate(rendered.token_ids, sampling, request_id):
            if chunk.token_ids and not output and sampled is not None:
                sampled()
            output.extend(chunk.token_ids)
            if chunk.finish_reason is not None:
                finish_reason = chunk.finish_reason
                if finish_reason == "abort":
                    raise _Aborted("the summary was aborted")
                if finish_reason not in ("stop", "length"):
                    raise EngineError(chunk.error or f"the engine stopped ({finish_reason})")
                break
        builder = ResponseBuilder(
            {"id": request_id, "object": "response", "output": []}, new_id=self._new_id
        )
        builder.created()
        builder.in_progress()
        decoder = HarmonyDecoder(service.encoding, builder)
        decoder.feed(output)
        result = decoder.finish(truncated=finish_reason != "stop")
        final = builder.finish("completed", usage=None)
        text = summary_of(final["output"])
        return Summary(
            text=text,
            prompt_ids=tuple(rendered.token_ids),
            output_ids=tuple(output),
            finish_reason=finish_reason or "stop",
            usage=Usage(
                input_tokens=len(rendered.token_ids),
                output_tokens=result.output_tokens,
                reasoning_tokens=result.reasoning_tokens,
            ),
        )

    # -- POST /v1/responses/compact --------------------------------------------------------------

    async def compact(self, body: Mapping[str, Any], *, project: str) -> dict[str, Any]:
        """OpenAI's ``CompactedResponse`` for ``body`` (the SDK's ``ResponseCompactParams``)."""
        for name in body:
            if name not in COMPACT_FIELDS:
                raise unknown_parameter(name)
        service = self._service
        service.check_accepting()
        fields = {k: body[k] for k in _AS_CREATE if k in body}
        check_request(fields)
        if not fields.get("model"):
            raise APIError(
                400,
                "Missing required parameter: 'model'.",
                param="model",
                code="missing_required_parameter",
            )
        request = CreateResponse.model_validate(
            {**fields, "input": fields.get("input") or [], "store": False}
        )
        service.resolve_model(request.model)
        if request.previous_response_id:
            service.check_writable()
        context = await self.context(request, project, None)
        if not context:
            raise _invalid("input", "There is nothing to compact: the input is empty.")
        request_id = self._new_id("cmpr")
        try:
            summary = await self.summarise(request, context, request_id, project=project)
        except NoSummary as exc:
            raise APIError(
                500,
                f"The context could not be compacted: {exc}.",
                type="server_error",
                code="compaction_failed",
            ) from None
        references = await item_refs.resolve(service.store, project, context)
        kept = [_resolved(item, references) for item in context]
        output = [
            *kept_user_messages([item for item in kept if item is not None]),
            compaction_item(self._new_id("cmp"), self.seal(summary.text)),
        ]
        return {
            "id": request_id,
            "object": "response.compaction",
            "created_at": int(time.time()),
            "output": output,
            "usage": usage_json(summary.usage),
        }

    async def context(
        self, request: CreateResponse, project: str, conversation: str | None
    ) -> list[dict[str, Any]]:
        """The items a compaction of ``request`` summarises: its history, then its input
        (without a final ``compaction_trigger``)."""
        from app.prompting import normalize_input

        service = self._service
        history: list[dict[str, Any]] = []
        if request.previous_response_id:
            history = await service.prompts.history(request.previous_response_id, project)
        elif conversation:
            history = await service.conversations.history(conversation, project)
        try:
            items, _ = split_trigger(normalize_input(request.input))
        except InvalidInput as exc:
            raise APIError(400, exc.message, param=exc.param, code=exc.code) from None
        return [*history, *(dict(item) for item in items)]

    # -- in a response ---------------------------------------------------------------------------

    async def plan(
        self,
        request: CreateResponse,
        input_items: Sequence[Mapping[str, Any]],
        rendered: RenderedPrompt,
        *,
        project: str,
        conversation: str | None,
    ) -> Plan | None:
        """The compaction ``request`` asks for, if any: a final ``compaction_trigger``, or a
        prompt over ``context_management``'s threshold."""
        only = bool(input_items) and input_items[-1].get("type") == TRIGGER
        if not only:
            threshold = self.threshold(request)
            if threshold is None or len(rendered.token_ids) <= threshold:
                return None
        context = await self.context(request, project, conversation)
        return Plan(request=request, context=context, only=only, project=project)

    def threshold(self, request: CreateResponse) -> int | None:
        entries = getattr(request, "context_management", None) or []
        if not entries:
            return None
        threshold = entries[0].get("compact_threshold")
        if threshold is not None:
            return int(threshold)
        limit = self._service.engine.max_model_len
        if limit is None:
            raise _invalid(
                "context_management[0].compact_threshold",
                "This engine reports no context window, so 'compact_threshold' cannot default to a "
                "share of it: give one.",
            )
        return int(limit * 0.8)

    async def run(self, plan: Plan, builder: ResponseBuilder, writer: LogWriter, run: Run) -> Step:
        """The compaction of a response: its ``compaction`` item opened, the summary written by
        the engine, sealed into the item and the item closed; then (unless it was a trigger) the
        prompt the answer is generated from, the compacted context with the request's input."""
        service = self._service
        builder.open_compaction()
        writer.push(builder.take())

        def compacting() -> None:  # ``response.compaction.compacting``, once sampling began
            builder.compacting()
            writer.push(builder.take())

        try:
            # under the response's engine request id: a cancel or a drain aborts the summary
            summary = await self.summarise(
                plan.request,
                plan.context,
                run.engine_request_id,
                project=plan.project,
                sampled=compacting,
            )
        except (NoSummary, EngineError) as exc:
            builder.close_item("incomplete")
            writer.push(builder.take())
            reason = "abort" if isinstance(exc, _Aborted) else "error"
            return Step(
                usage=Usage(),
                error=f"The context could not be compacted: {exc}",
                finish_reason=reason,
            )
        item = builder.close_compaction(self.seal(summary.text))
        writer.push(builder.take())
        if run.store:
            detail = {"item_id": item["id"], "finish_reason": summary.finish_reason}
            service._submit_audit(
                run.id,
                [
                    AuditRecord("compaction_prompt_token_ids", summary.prompt_ids, detail),
                    AuditRecord("compaction_output_token_ids", summary.output_ids, detail),
                ],
            )
        if plan.only:
            return Step(usage=summary.usage)
        request = plan.request
        kept = kept_user_messages(plan.context)
        items = [*(dict(i) for i in kept), item]
        references = await item_refs.resolve(service.store, plan.project, items)
        rendered, _ = await service.prompts.render(request, [], items, references)
        sampling = service.prompts.sampling(request, rendered, len(rendered.token_ids))
        return Step(usage=summary.usage, prompt=rendered, sampling=sampling)


class _Aborted(EngineError):
    """The engine aborted the summary (the response was cancelled, or the server drains)."""


def _resolved(
    item: dict[str, Any], references: Mapping[str, dict[str, Any]]
) -> dict[str, Any] | None:
    if item.get("type") == "item_reference":
        return references.get(str(item.get("id")))
    return item
