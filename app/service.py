"""The service layer: creating, generating, reading and cancelling responses.

``create`` validates a request completely *before* anything is generated or stored (model name,
``tool_choice``, the ``previous_response_id`` chain, every input item, the context length), so a
bad request is a 4xx with nothing left behind. It then writes the response row, starts one
generation task per response (the response's only writer), and returns the live :class:`Run`.

The generation task: render -> engine -> :class:`~domain.decoder.HarmonyDecoder` ->
:class:`~domain.builder.ResponseBuilder` (which checks every event against the state machine) ->
:class:`~app.live.LogWriter` (group commit, then publish). It survives its client going away;
only a ``store=false`` response, which nobody could ever read again, is aborted with its stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from typing import Any

from openai_harmony import HarmonyEncoding

from app.compaction import Compactions, Plan
from app.contract import UNSET_FIELDS
from app.conversations import Conversations, ConversationTurn, conversation_param
from app.drain import Drain
from app.engines.protocol import Engine, EngineError, Sampling
from app.errors import APIError, not_found
from app.feed import ChunkFeed, Paced
from app.ids import new_id
from app.leases import new_replica
from app.live import (
    Backlog,
    Batch,
    LogWriter,
    Run,
    Subscription,
    SubscriptionOverflow,
    error_frame,
    stored_frames,
)
from app.metrics import Metrics
from app.prompting import Prompts, normalize_input
from app.reasoning_crypto import ReasoningCipher
from app.remote_cancel import RemoteCancels
from app.repair import STORE_UNAVAILABLE, Repairs, store_unavailable_error
from app.settings import Settings
from app.tails import TailReads
from app.takeover import TAKEOVER_FAILED, GenerationSpec, Resumed, Takeovers
from app.turns import TurnGate
from app.wire import CreateResponse, list_page
from domain.builder import ResponseBuilder, TerminalStatus, Usage
from domain.decoder import DecodeResult, HarmonyDecoder
from domain.events import TERMINAL_TYPES
from domain.projections import fold, from_wire
from domain.truncation import truncation_audit
from persistence.doorbell import Doorbell, LocalDoorbell
from persistence.errors import Fenced, NotFound, StoreError, StoreUnavailable
from persistence.records import DEFAULT_PROJECT, AuditRecord, NewResponse, StoredEvent
from persistence.store import REPLICAS_CHANNEL, EventStore

__all__ = ["ResponseService", "model_not_found", "normalize_input"]

log = logging.getLogger(__name__)

#: Fields of the request that the Response object echoes back (OpenAI's behaviour).
_ECHOED = (
    "instructions",
    "max_output_tokens",
    "max_tool_calls",
    "metadata",
    "parallel_tool_calls",
    "previous_response_id",
    "prompt_cache_key",
    "safety_identifier",
    "service_tier",
    "store",
    "text",
    "tool_choice",
    "tools",
    "top_logprobs",
    "truncation",
    "user",
    "background",
)


#: Events read from the store per query when replaying a log.
_PAGE = 256
_TERMINAL_STATUSES = frozenset({"completed", "incomplete", "failed", "cancelled"})


def _now() -> int:
    return int(time.time())


def model_not_found(name: str) -> APIError:
    """OpenAI's 404 for a model this server does not serve (a request's ``model``, a retrieve)."""
    return APIError(
        404,
        f"The model `{name}` does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


class ResponseService:
    def __init__(
        self,
        settings: Settings,
        store: EventStore,
        engine: Engine,
        encoding: HarmonyEncoding,
        cipher: ReasoningCipher,
        doorbell: Doorbell | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        """``doorbell``: how this replica hears of other replicas' commits, cancels and leases
        (``persistence.doorbell``; the store's own if it has one, else one for this process).
        ``metrics``: what its runs and streams are counted in (``app.metrics``); none: off."""
        self.settings = settings
        self.store = store
        self.engine = engine
        self.encoding = encoding
        self.cipher = cipher
        self._live: dict[str, Run] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._backlog = Backlog()
        #: Closes logs the database could not take when they ended (``app.repair``).
        #: This process as a replica: the owner of every response it creates (``app.leases``).
        self.replica = new_replica()
        self.doorbell: Doorbell = doorbell or getattr(store, "doorbell", None) or LocalDoorbell()
        #: Orphaned responses, claimed and continued here (``app.takeover``).
        self.takeovers = Takeovers(self, mode=settings.takeover, new_id=new_id)
        self.repairs = Repairs(
            store,
            interval_s=settings.repair_interval_s,
            new_id=new_id,
            is_live=self._live.__contains__,
            replica=self.replica,
            lease_s=settings.lease_s,
            heartbeat_s=settings.heartbeat_s,
            take_over=self.takeovers.take,
            on_replicas=self._replicas_seen,
        )
        #: Cancels asked through other replicas of responses generated here (``app.remote_cancel``).
        self.remote_cancels = RemoteCancels(
            store, self.doorbell, self.replica.id, self._cancel_here
        )
        #: SIGTERM: finish, hand over or end what runs here (``app.drain``).
        self.drain = Drain(settings.drain_s)
        #: Whether other processes share the database (PostgreSQL): replicas, hand-overs.
        self.store_is_shared = settings.database_url.startswith("postgresql")
        #: SSE streams being served now.
        self.open_streams = 0
        #: The followers' reads of logs written elsewhere, batched (``app.tails``).
        self.tails = TailReads(store)
        self._replicas_task: asyncio.Task[None] | None = None
        #: The Conversations API, and the history and turns of responses naming one.
        self.conversations = Conversations(
            store, encoding, cipher, new_id=new_id, normalize=normalize_input
        )
        #: Compaction: ``/v1/responses/compact``, ``compaction_trigger``, ``context_management``.
        self.compactions = Compactions(self, new_id=new_id)
        #: The prompts of requests: history, references, rendering, truncation, sampling.
        self.prompts = Prompts(
            store,
            engine,
            encoding,
            self.conversations,
            default_effort=settings.default_reasoning_effort,
            decrypt=cipher.decrypt,
            open_compaction=self.compactions.open,
        )
        #: Streams following a log written elsewhere now (``_follow``).
        self.followers = 0
        #: Generations whose engine paces them, running now (``app.feed``).
        self._paced = Paced()
        #: New responses are set up one a turn of the event loop, and while paced responses are
        #: generating, in at most ``setup_share`` of its time (``app.turns``).
        self.turns = TurnGate(self._paced.__bool__, settings.setup_share)
        self.metrics = metrics if metrics is not None else Metrics(enabled=False)
        self._timing = self.metrics.stream if self.metrics.enabled else None
        self.metrics.attach(self)

    # -- models ----------------------------------------------------------------------------------

    def model_names(self) -> list[str]:
        return [*self.engine.model_names, *self.settings.model_aliases]

    def resolve_model(self, name: str) -> str:
        """The served model a request's ``model`` names (an alias resolves to its target, which
        the Response reports, as OpenAI reports the snapshot an alias points to)."""
        if name in self.engine.model_names:
            return name
        if name in self.settings.model_aliases:
            return self.settings.model_aliases[name]
        raise model_not_found(name)

    # -- create ----------------------------------------------------------------------------------

    def check_accepting(self) -> None:
        """Refuse a new response while draining (503: a balancer retries it elsewhere)."""
        if self.drain.draining:
            raise APIError(
                503,
                "This server is shutting down and takes no new responses; retry on another one.",
                type="server_error",
                code="server_draining",
                headers={"Retry-After": "1"},
            )

    def check_writable(self) -> None:
        """Refuse a write at once (503, Retry-After) while the database cannot take writes,
        rather than letting it wait out the store's retry time and fail then."""
        health = self.store.health
        if health.failing:
            raise StoreUnavailable(health.reason or "unknown")

    async def create(
        self,
        request: CreateResponse,
        body: dict[str, Any],
        *,
        project: str = DEFAULT_PROJECT,
        api_key_id: str | None = None,
    ) -> Run:
        """``project``: whose response it is (and the only project its ``previous_response_id``
        chain may come from); ``api_key_id``: the key that asked for it."""
        started = time.monotonic()
        await self.turns.turn()  # a burst of requests waits its turns, not the running streams
        self.check_accepting()
        model = self.resolve_model(request.model)
        if request.background and not request.store:
            raise APIError(
                400,
                "background responses require store=true.",
                param="background",
                code="invalid_value",
            )
        conversation = conversation_param(
            getattr(request, "conversation", None), request.previous_response_id
        )
        if request.store or request.previous_response_id or conversation:
            self.check_writable()  # a store=false response without history needs no database
        input_items, rendered, truncated = await self.prompts.prompt(request, project, conversation)
        compaction = await self.compactions.plan(
            request, input_items, rendered, project=project, conversation=conversation
        )
        prompt_ids = rendered.token_ids
        sampling = self.prompts.sampling(request, rendered, len(prompt_ids))

        response_id = new_id("resp")
        created_at = _now()
        run = Run(
            id=response_id,
            store=request.store,
            background=request.background,
            engine_request_id=response_id,
            model=model,
            started=started,
        )
        skeleton = self.skeleton(request, response_id, created_at, model)
        if conversation:
            skeleton["conversation"] = {"id": conversation}
        if request.store:
            # Not awaited: the response row is queued for group commit and the first events
            # follow it into the same commit, so the first token waits for one fsync, not two.
            # Nothing is published before it is durable, and if the row cannot be written the
            # events behind it fail too (the run ends with ``run.error``).
            new_response = NewResponse(
                id=response_id,
                model=model,
                created_at=created_at,
                previous_response_id=request.previous_response_id,
                background=request.background,
                request=body,
                input_items=input_items,
                project=project,
                api_key_id=api_key_id,
                owner=self.replica.id,
            )
            try:
                stored = self.store.submit_create(new_response)
            except ValueError as exc:  # what the edge let through but no database can hold
                raise APIError(
                    400, f"The request cannot be stored: {exc}.", code="invalid_value"
                ) from None
            stored.add_done_callback(_retrieve)  # its failure is reported through the run
            self._live[response_id] = run
        spec = GenerationSpec.of(
            rendered, sampling, encrypt_reasoning=request.include_encrypted_reasoning
        )
        builder = ResponseBuilder(
            skeleton,
            new_id=new_id,
            encrypt_reasoning=self.cipher.encrypt if spec.encrypt_reasoning else None,
            coalesce=self.settings.coalesce_deltas,  # a delta a commit, not a token (``LogWriter.pull``)
        )
        # Made once response.created is out: a named tool_choice's prefill opens the call item.
        new_decoder = functools.partial(spec.decoder, self.encoding, builder)
        if request.stream:
            run.first_queue = run.subscribe()  # before the first event can be published
        self.launch(
            run,
            self._generate(
                run,
                builder,
                new_decoder,
                prompt_ids,
                sampling,
                forced_call=spec.forced_call and not (compaction is not None and compaction.only),
                skeleton=skeleton,
                generation=spec.to_json() | truncation_audit(truncated),
                turn=ConversationTurn(conversation, project, input_items) if conversation else None,
                compaction=compaction,
            ),
        )
        return run

    def launch(self, run: Run, generation: Coroutine[Any, Any, None]) -> None:
        """Start ``run``'s generation task (its log's only writer here)."""
        if run.store:
            self._live[run.id] = run
        task = asyncio.create_task(generation)
        run.task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if self.metrics.enabled:
            task.add_done_callback(functools.partial(self.metrics.run_ended, run))

    def skeleton(
        self, request: CreateResponse, response_id: str, created_at: int, model: str
    ) -> dict[str, Any]:
        """The Response of ``response.created``: every field of OpenAI's, the request echoed."""
        data = request.model_dump()
        skeleton: dict[str, Any] = {
            **UNSET_FIELDS,  # every field of OpenAI's Response, null until known
            "id": response_id,
            "object": "response",
            "created_at": created_at,
            "model": model,
            "status": "in_progress",
            "error": None,
            "incomplete_details": None,
            "output": [],
            "usage": None,
            "temperature": request.temperature if request.temperature is not None else 1.0,
            "top_p": request.top_p if request.top_p is not None else 1.0,
            "reasoning": {
                "effort": (request.reasoning.effort if request.reasoning else None)
                or self.settings.default_reasoning_effort,
                "summary": request.reasoning.summary if request.reasoning else None,
            },
        }
        for name in _ECHOED:
            skeleton[name] = data.get(name)
        # OpenAI echoes function tools with ``strict`` filled in (default true); its schema requires it
        skeleton["tools"] = [
            {**tool, "strict": tool.get("strict", True)} if tool.get("type") == "function" else tool
            for tool in request.tools
        ]
        skeleton["metadata"] = request.metadata or {}
        skeleton["text"] = request.text or {"format": {"type": "text"}}
        skeleton["truncation"] = request.truncation or "disabled"
        skeleton["service_tier"] = request.service_tier or "default"
        skeleton["top_logprobs"] = request.top_logprobs or 0
        skeleton["presence_penalty"] = request.presence_penalty or 0.0
        skeleton["frequency_penalty"] = request.frequency_penalty or 0.0
        skeleton["prompt_cache_retention"] = request.prompt_cache_retention
        return skeleton

    # -- generate --------------------------------------------------------------------------------

    async def _generate(
        self,
        run: Run,
        builder: ResponseBuilder,
        new_decoder: Callable[[], HarmonyDecoder] | None,
        prompt_ids: Sequence[int],
        sampling: Sampling,
        *,
        forced_call: bool = False,
        skeleton: dict[str, Any] | None = None,
        generation: dict[str, Any] | None = None,
        resumed: Resumed | None = None,
        turn: ConversationTurn | None = None,
        compaction: Plan | None = None,
    ) -> None:
        """``forced_call``: ``tool_choice`` was ``required`` or named, so a turn that ends without
        calling a tool is not accepted as an answer: it ends ``failed`` (its text is kept).
        ``generation``: how to continue it (``app.takeover``), kept with the prompt's audit record.
        ``resumed``: a takeover going on with an existing log (``app.takeover``): its builder and
        decoder are where the log ended, and the engine continues after the logged tokens.
        ``turn``: the conversation the response names; its turn is appended before the terminal
        event is written (``app.conversations``).
        ``compaction``: the context is compacted first (``app.compaction``): the answer is then
        generated from the compacted context, or, for a ``compaction_trigger``, not at all.

        While the database is failing, generation pauses whenever this response has events
        waiting for a commit (the store retries it); if the store gives up, the run ends with
        ``run.error``, its streams with an ``error`` event, and the repair loop closes the log."""
        writer = LogWriter(
            run,
            self.store.submit_then if run.store else None,
            self._backlog,
            next_seq=resumed.next_seq if resumed is not None else 0,
            timing=self._timing,
        )
        finish_reason: str | None = None
        engine_error: str | None = None
        output_ids: list[int] = []
        prompt_audit: asyncio.Future[None] | None = None
        engine_prompt: Sequence[int] = prompt_ids
        compacted = Usage()
        try:
            if resumed is None:
                builder.created(queued=run.background)
                created = builder.take()
                # what the POST of a background response answers with, once durable (no copy:
                # the event is immutable); run.created is set when these are published
                run.created_response = created[-1].response  # type: ignore[union-attr]
                if run.background:  # the POST answers with the snapshot: wait before generating
                    writer.push(created)
                    await writer.drain()
                    created = []
                builder.in_progress()
                assert new_decoder is not None  # only a takeover (``resumed``) has none
                # response.created and response.in_progress in one commit, not one each
                writer.push([*created, *builder.take()])
                if compaction is not None:
                    step = await self.compactions.run(compaction, builder, writer, run)
                    compacted = step.usage
                    if step.prompt is None:  # nothing more is generated: no prefilled call either
                        new_decoder = functools.partial(HarmonyDecoder, self.encoding, builder)
                    if step.error is not None:
                        finish_reason, engine_error = step.finish_reason, step.error
                    elif step.prompt is None:  # a compaction_trigger: the item is the output
                        finish_reason, prompt_ids = "stop", ()
                    else:
                        assert step.sampling is not None
                        prompt_ids = engine_prompt = step.prompt.token_ids
                        sampling = step.sampling
                decoder = new_decoder()
                writer.push(builder.take())
                prompt_audit = (  # written while the engine runs, not before it starts
                    self._submit_audit(
                        run.id, [AuditRecord("prompt_token_ids", tuple(prompt_ids), generation)]
                    )
                    if run.store
                    else None
                )
            else:
                decoder = resumed.decoder
                output_ids.extend(resumed.tokens)
                writer.push(resumed.pending)
                prompt_audit = self._submit_audit(run.id, [resumed.audit])
                finish_reason = resumed.finish_reason  # set when nothing is left to generate
                engine_prompt = [*prompt_ids, *resumed.tokens]
                sampling = dataclasses.replace(
                    sampling,
                    generated=len(resumed.tokens),
                    max_tokens=None
                    if sampling.max_tokens is None
                    else sampling.max_tokens - len(resumed.tokens),
                )
            # Coalescing (``RESPONSES_LEDGER_COALESCE_DELTAS``): while the tokens stream, a commit
            # takes the builder's events when it can (one delta for all the text that waited for
            # it, see ``LogWriter.pull``); after the feed, events are pushed explicitly again (a
            # conversation's turn is recorded, an await, between the terminal events and their
            # push). Without it, every chunk's events are pushed at once, as they always were
            # (measured: pulling them instead cost ~5 µs a token at 256 paced streams).
            if builder.coalesce:
                writer.pull = builder.take
            # the last chunk's events wait for the terminal ones, pushed right after the feed in
            # this same turn: one commit for both (not so with a conversation, whose turn is
            # recorded, an await, in between)
            feed = ChunkFeed(
                decoder,
                builder,
                writer,
                self._backlog,
                self.store.health,
                output_ids,
                hold_last=turn is None,
                paced=self._paced,
            )
            try:
                if finish_reason is None:
                    await feed.run(
                        self.engine.generate(engine_prompt, sampling, run.engine_request_id)
                    )
                    finish_reason, engine_error = feed.finish_reason, feed.error
            except EngineError as exc:
                finish_reason, engine_error = "error", str(exc)
            except Exception as exc:  # an engine bug must not leave the response open
                log.exception("response %s: engine failed", run.id, extra={"response_id": run.id})
                finish_reason, engine_error = "error", f"{type(exc).__name__}: {exc}"
            finally:
                writer.pull = None
            if finish_reason is None:
                finish_reason, engine_error = "error", "the engine stopped without a finish reason"
            result = decoder.finish(truncated=finish_reason != "stop")
            if result.recovered:
                log.warning(
                    "response %s: recovered malformed model output (%s)",
                    run.id,
                    "; ".join(result.notes),
                )
            status, error, reason = self._outcome(run, finish_reason, engine_error)
            if resumed is not None and error is not None and len(output_ids) == len(resumed.tokens):
                # the engine would not go on with it (it refused the continuation)
                error = {
                    "code": TAKEOVER_FAILED,
                    "message": f"{resumed.reason}, and this server's engine could not continue it: "
                    f"{error['message']}",
                }
            if status == "completed" and forced_call and result.calls == 0:
                status, error = (
                    "failed",
                    {
                        "code": "server_error",
                        "message": "tool_choice requires a tool call, but the model did not call a tool",
                    },
                )
            usage = Usage(
                input_tokens=len(prompt_ids) + compacted.input_tokens,
                cached_tokens=feed.cached,
                output_tokens=result.output_tokens + compacted.output_tokens,
                reasoning_tokens=result.reasoning_tokens + compacted.reasoning_tokens,
            )
            final = builder.finish(
                status, usage=usage, completed_at=_now(), error=error, incomplete_reason=reason
            )
            if turn is not None:
                await self.conversations.record(turn, run.id, final)
            writer.push(builder.take())
            # Queued right behind the terminal events, in the same turn, so both share one
            # commit; never before them (a crash cannot leave an audit "finish" for a log that
            # recovery then closes otherwise).
            output_records = [
                AuditRecord("output_token_ids", tuple(output_ids)),
                AuditRecord(
                    "finish", detail=self._finish_detail(finish_reason, engine_error, result)
                ),
            ]
            output_audit = (
                writer.submit_after(functools.partial(self._submit_audit, run.id, output_records))
                if run.store
                else None
            )
            if output_audit is not None:
                output_audit.add_done_callback(_retrieve)
            await writer.drain()
            run.final_response = final
            if prompt_audit is not None:
                await prompt_audit
            if output_audit is not None:
                await output_audit
        except asyncio.CancelledError:
            await self.engine.abort(run.engine_request_id)
            raise
        except BaseException as exc:  # a Rust panic (openai-harmony) is not an Exception
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            if isinstance(exc, Fenced | NotFound) and run.store:
                # taken over by another replica (it goes on with the log), or deleted: stop
                # generating, write nothing; this replica's streams follow the log
                log.warning("response %s: stopped here (%s)", run.id, exc)
                run.handed_off = True
                with contextlib.suppress(Exception):
                    await self.engine.abort(run.engine_request_id)
                return
            if isinstance(exc, StoreUnavailable):
                log.error(
                    "response %s: stopped, the database is unavailable (%s)",
                    run.id,
                    exc.reason,
                    extra={"response_id": run.id},
                )
            else:
                log.exception(
                    "response %s: generation failed", run.id, extra={"response_id": run.id}
                )
            run.error = exc
            with contextlib.suppress(
                Exception
            ):  # e.g. the log could not be written: stop the engine
                await self.engine.abort(run.engine_request_id)
            if run.store and skeleton is not None:
                # its log has no terminal event: the repair loop writes one when it can
                self.repairs.strand(run.id, skeleton, self._failure(exc))
        finally:
            writer.close()
            self._live.pop(run.id, None)
            run.created.set()
            run.finished.set()
            if run.final_response is None:
                run.publish(Batch(0, (), terminal=True))  # wake stream readers: nothing more comes

    def _failure(self, exc: BaseException) -> dict[str, Any]:
        """The ``error`` of a response whose run died of ``exc`` (not the engine's doing)."""
        if isinstance(exc, StoreUnavailable):
            return store_unavailable_error(self.settings.store_retry_s)
        return {
            "code": "server_error",
            "message": "The server had an error while generating this response.",
        }

    def _submit_audit(self, response_id: str, records: list[AuditRecord]) -> asyncio.Future[None]:
        """Queue audit records; whoever awaits the future sees a failure, and a future nobody
        awaits any more (the run failed first) does not warn: the store has logged it."""
        future = self.store.submit_audit(response_id, records)
        future.add_done_callback(_retrieve)
        return future

    @staticmethod
    def _finish_detail(reason: str, error: str | None, result: DecodeResult) -> dict[str, Any]:
        detail: dict[str, Any] = {"finish_reason": reason, "recovered": result.recovered}
        if error:
            detail["error"] = error
        if result.notes:
            detail["notes"] = result.notes
        return detail

    @staticmethod
    def _outcome(
        run: Run, finish_reason: str, engine_error: str | None
    ) -> tuple[TerminalStatus, dict[str, Any] | None, str | None]:
        if finish_reason == "stop":
            return "completed", None, None
        if finish_reason == "length":
            return "incomplete", None, "max_output_tokens"
        if finish_reason == "abort" and run.cancel_requested:
            return "cancelled", None, None
        if finish_reason == "abort" and run.stop_reason is not None:
            return "incomplete", None, run.stop_reason
        message = engine_error or "generation was aborted"
        return "failed", {"code": "server_error", "message": message}, None

    # -- reading ---------------------------------------------------------------------------------

    async def get(self, response_id: str) -> dict[str, Any]:
        row = await self.store.get(response_id)
        if row is None:
            raise not_found("Response", response_id)
        if row.last_seq < 0:
            raise APIError(409, f"Response '{response_id}' has no events yet.", code="not_ready")
        last = await self.store.load(response_id, after_seq=row.last_seq - 1)
        if last and last[-1].type in TERMINAL_TYPES:
            return dict(last[-1].payload["response"])
        events = await self.store.load(response_id)
        return fold(from_wire(e.type, e.seq, e.payload) for e in events)

    async def stream(
        self,
        response_id: str,
        after: int = -1,
        *,
        run: Run | None = None,
        queue: Subscription | None = None,
        direct: Callable[[], Callable[[bytes], bool] | None] | None = None,
    ) -> AsyncIterator[bytes]:
        """SSE bytes of the log after ``after``, then the live events until the terminal one.

        A reader of an existing response subscribes to the live run (if this process is
        generating it) *before* reading the store, and skips live batches it already read, so
        nothing is missed or sent twice. The creating request passes the ``queue`` it subscribed
        before generation started, and reads nothing from the store. A response that another
        process is writing (or that the repair loop will close) is followed by polling the store.

        Every stream ends with its terminal event or, if none can come (the run stopped without
        one, the database stayed unreachable), with an ``error`` event: never a silent end.

        ``direct`` (the creating request's, ``app.http``): once the first batch has been sent, it
        gives a writer to the connection (``transport.body_writer``), and the batches after it
        are written from the commits that publish them (``Subscription.attach``) until the
        terminal one, which comes back through here.
        """
        read_store = queue is None
        # A reader of the stored log may fall behind the live run (its client reads slowly):
        # its queue is bounded, and past the bound it reads from the log again (every published
        # batch is in the log), instead of holding the run's output in memory.
        limit = self.settings.send_buffer_bytes
        if queue is None:
            run = self._live.get(response_id)
            queue = run.subscribe(limit if run.store else None) if run is not None else None
        sent = after
        self.open_streams += 1
        try:
            while True:
                if read_store:
                    # page through the stored log, so the first bytes go out without reading it
                    # all (and, after the live queue overflowed, to catch up from it)
                    while True:
                        events = await self._load(response_id, sent, _PAGE)
                        if events:
                            sent = events[-1].seq
                            yield stored_frames(events)
                            if events[-1].type in TERMINAL_TYPES:
                                return
                        if len(events) < _PAGE:
                            break
                    if sent == after and run is None:
                        row = await self.store.get(response_id)
                        if row is None or (
                            row.status in _TERMINAL_STATUSES and row.last_seq <= sent
                        ):
                            return  # nothing after ``after``, and nothing more will come
                        if row.status in _TERMINAL_STATUSES:
                            continue  # it ended between the read and now: read its end
                if queue is None:
                    break
                assert run is not None
                if run.finished.is_set() and queue.empty():
                    if run.handed_off:
                        break  # another replica goes on with it: follow the log
                    yield self._run_error_frame(run, sent)
                    return
                try:
                    batch: Batch = await queue.get()
                except SubscriptionOverflow:  # fell behind: catch up from the log, then go on
                    run.unsubscribe(queue)
                    queue = run.subscribe(limit)
                    read_store = True
                    continue
                read_store = False
                frames = batch.frames
                skip = sent + 1 - batch.first_seq  # > 0 only for what the store read gave
                if skip < len(frames):
                    sent = batch.last_seq
                    yield b"".join(frames[skip:] if skip > 0 else frames)
                if batch.terminal:
                    if not frames:  # the run stopped without a terminal event
                        if run.handed_off:
                            break
                        yield self._run_error_frame(run, sent)
                    return
                if direct is not None:  # the first batch is out: the rest go straight out
                    write, direct = direct(), None
                    if write is not None:
                        await queue.attach(write)
                        sent = max(sent, queue.written)
            # written by another process, or to be closed by the repair loop
            async for frames_or_end in self._follow(response_id, sent):
                if isinstance(frames_or_end, bytes):
                    yield frames_or_end
                    continue
                sent = frames_or_end
        except StoreUnavailable as exc:
            yield error_frame(
                sent + 1, STORE_UNAVAILABLE, f"The database is unavailable: {exc.reason}"
            )
        except StoreError:
            log.exception("response %s: stream read failed", response_id)
            yield error_frame(sent + 1, "server_error", "The server could not read this response.")
        finally:
            self.open_streams -= 1
            if run is not None and queue is not None:
                run.unsubscribe(queue)

    async def _follow(self, response_id: str, after: int) -> AsyncIterator[bytes | int]:
        """The log after ``after`` as another replica (or the repair loop) writes it: SSE bytes,
        each followed by the last seq they hold (an ``int``), until the terminal event. Woken
        by the doorbell the writer rings after each commit; polled too (every second, or every
        100 ms while the doorbell is down), so a lost ring delays, never loses. A log deleted
        meanwhile, or a server shutting down, ends it with an ``error`` event."""
        sent = after
        caught_up = False  # then a wake-up reads with the other followers (``app.tails``)
        # Whether the log still exists is asked only when the bell stayed silent, or rang twice
        # with nothing new: a batched read often takes a commit's events before its ring
        # arrives, and a question per follower per such ring cost a query each (64 followers:
        # enough to put the replica behind, and its lag in the hundreds of milliseconds).
        rung, empty = True, 0
        with self.doorbell.listen(response_id) as bell, self._following():
            while True:
                events: list[StoredEvent] | None = None
                if caught_up:
                    with contextlib.suppress(StoreError):  # read alone, with retries, below
                        events = await self.tails.read(response_id, sent)
                if events is None:
                    events = await self._load(response_id, sent, _PAGE)
                    caught_up = len(events) < _PAGE
                if events:
                    empty = 0
                    sent = events[-1].seq
                    yield stored_frames(events)
                    yield sent
                    if events[-1].type in TERMINAL_TYPES:
                        return
                    if not caught_up:
                        continue
                else:
                    empty += 1
                    if (not rung or empty >= 2) and await self.store.get(response_id) is None:
                        yield error_frame(
                            sent + 1, "not_found", f"Response '{response_id}' was deleted."
                        )
                        return
                if self.drain.streams_over():
                    yield error_frame(
                        sent + 1,
                        "server_shutting_down",
                        "This server is shutting down; resume the stream on another one "
                        f"(GET /v1/responses/{response_id}?stream=true&starting_after={sent}).",
                    )
                    return
                rung = await bell.wait(1.0 if self.doorbell.connected else 0.1)

    @contextlib.contextmanager
    def _following(self) -> Iterator[None]:
        self.followers += 1
        try:
            yield
        finally:
            self.followers -= 1

    async def _load(self, response_id: str, after: int, limit: int | None) -> list[StoredEvent]:
        """A read for a stream: while the database is unavailable, retried for up to the
        store's retry time (the client keeps its stream, with keep-alive comments), then
        ``StoreUnavailable``."""
        deadline = time.monotonic() + self.settings.store_retry_s
        pause = 0.05
        while True:
            try:
                return await self.store.load(response_id, after_seq=after, limit=limit)
            except StoreUnavailable:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                await asyncio.sleep(min(pause, left))
                pause = min(pause * 2, 1.0)

    def _run_error_frame(self, run: Run, sent: int) -> bytes:
        """The last frame of a stream whose run stopped without a terminal event."""
        error = run.error
        if isinstance(error, StoreUnavailable):
            return error_frame(
                sent + 1,
                STORE_UNAVAILABLE,
                f"The database stayed unavailable for {self.settings.store_retry_s:g} s "
                f"({error.reason}); the response was stopped and will be closed as failed.",
            )
        return error_frame(
            sent + 1, "server_error", "The server had an error while generating this response."
        )

    async def events(self, response_id: str) -> dict[str, Any]:
        row = await self.store.get(response_id)
        if row is None:
            raise not_found("Response", response_id)
        events = await self.store.load(response_id)
        audit = await self.store.load_audit(response_id)
        return {
            "object": "list",
            "response_id": response_id,
            "data": [{"seq": e.seq, "type": e.type, "payload": e.payload} for e in events],
            "audit": [
                {"kind": a.kind, "token_ids": list(a.token_ids), "detail": a.detail} for a in audit
            ],
        }

    async def input_items(
        self, response_id: str, *, after: str | None, limit: int, order: str
    ) -> dict[str, Any]:
        if await self.store.get(response_id) is None:
            raise not_found("Response", response_id)
        items, has_more = await self.store.list_input_items(
            response_id,
            after=after,
            limit=limit,
            order=order,  # type: ignore[arg-type]
        )
        return list_page(items, has_more=has_more)

    # -- cancel, delete --------------------------------------------------------------------------

    async def cancel(self, response_id: str) -> dict[str, Any]:
        self.check_writable()
        row = await self.store.get(response_id)
        if row is None:
            raise not_found("Response", response_id)
        if not row.background:
            raise APIError(
                400,
                "Only responses created with background=true can be cancelled.",
                code="invalid_request",
            )
        run = self._live.get(response_id)
        if run is not None and not run.finished.is_set():
            await self._cancel_here(response_id)
            await run.finished.wait()
            if not run.handed_off:
                return await self.get(response_id)
        elif row.status not in _TERMINAL_STATUSES and await self.remote_cancels.request(
            response_id, row.owner
        ):
            # generated by another replica: its owner is asked; follow the log to its end
            await self._wait_terminal(response_id, row.last_seq)
        response = await self.get(response_id)
        if response["status"] in ("queued", "in_progress"):
            raise APIError(
                409,
                f"Response '{response_id}' is being generated by another server, which has not "
                "acted on the cancel yet; it will be cancelled when it does.",
                code="conflict",
            )
        if response["status"] != "cancelled":
            raise APIError(
                400,
                f"Cannot cancel a response with status '{response['status']}'.",
                code="invalid_request",
            )
        return response

    async def delete(self, response_id: str) -> dict[str, Any]:
        self.check_writable()
        run = self._live.get(response_id)
        if run is not None and run.task is not None:
            run.cancel_requested = True
            await self.engine.abort(run.engine_request_id)
            await run.finished.wait()
        if not await self.store.delete(response_id):
            raise not_found("Response", response_id)
        # its followers anywhere learn it is gone; a replica generating it is fenced out by its
        # next commit (the row it appends to is gone) and stops
        self.doorbell.ring(response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    async def _cancel_here(self, response_id: str) -> bool:
        """Cancel a response this replica generates (without waiting for its end)."""
        run = self._live.get(response_id)
        if run is None or run.finished.is_set():
            return False
        run.cancel_requested = True
        await self.engine.abort(run.engine_request_id)
        return True

    async def _wait_terminal(self, response_id: str, after: int, timeout_s: float = 10.0) -> None:
        """Follow ``response_id``'s log after ``after`` to its end (or for ``timeout_s``)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                async for _ in self._follow(response_id, after):
                    pass

    async def abort_unread(self, run: Run) -> None:
        """A ``store=false`` stream's client went away: nobody can read the answer, stop it."""
        if run.task is not None and not run.task.done():
            run.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run.task

    # -- start-up and shutdown -------------------------------------------------------------------

    def start(self) -> None:
        """The background work of a running replica: the repair loop (heartbeat, sweeps,
        takeovers), cancels asked elsewhere, and sweeps when another replica leaves."""
        self.repairs.start()
        self.remote_cancels.start()
        if self._replicas_task is None:
            self._replicas_task = asyncio.create_task(self._watch_replicas(), name="app.replicas")

    def _replicas_seen(self, live: Sequence[str]) -> None:
        """A sweep's live replicas: alone, this replica's commits ring no other process (a
        replica that starts rings ``REPLICAS``, so this one sweeps and knows at once)."""
        self.doorbell.alone = all(replica == self.replica.id for replica in live)

    async def _watch_replicas(self) -> None:
        with self.doorbell.listen(REPLICAS_CHANNEL) as bell:
            while True:
                if await bell.wait(60.0):
                    self.repairs.sweep_now()

    def live_runs(self) -> list[Run]:
        return [run for run in self._live.values() if not run.finished.is_set()]

    async def hand_off(self, runs: Sequence[Run]) -> None:
        """Stop generating ``runs`` here without ending their logs, and release this replica's
        lease so that the others take them over at once (a drain)."""
        await self.repairs.stop()  # no more heartbeats: the lease must not come back
        for run in runs:
            run.handed_off = True
            if run.task is not None:
                run.task.cancel()
        await asyncio.gather(*(run.finished.wait() for run in runs))
        await self.store.release(self.replica.id)

    async def stop_runs(self, runs: Sequence[Run], reason: str) -> None:
        """End ``runs`` now, ``response.incomplete`` with ``reason``."""
        for run in runs:
            run.stop_reason = reason
            await self.engine.abort(run.engine_request_id)
        await asyncio.gather(*(run.finished.wait() for run in runs))

    async def shutdown(self) -> None:
        if self._replicas_task is not None:
            self._replicas_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replicas_task
        await self.remote_cancels.stop()
        await self.repairs.stop()
        await self.tails.close()
        for run in list(self._live.values()):
            await self.engine.abort(run.engine_request_id)
        tasks = list(self._tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=10)
        with contextlib.suppress(StoreError):  # gone cleanly: nothing of ours to sweep
            await self.store.release(self.replica.id)


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()
