"""Takeover: a response outlives the server generating it.

When a replica dies (or loses its lease, or hands its responses over while draining), its
unfinished responses are *orphaned* (``app.leases``). The repair loop of a surviving replica
(``app.repair``) finds each one and hands it here. :meth:`Takeovers.take`:

1. **claims** it (``store.claim``: the owner becomes this replica and the epoch goes up by one,
   in one conditional UPDATE, so exactly one claimant wins, and every later append of the old
   owner is fenced out: see ``persistence.sql``);
2. reads its log, the output token ids behind it (durable with the events: each append carries
   its tokens) and the prompt's audit record, whose ``detail`` holds how it was being generated
   (:class:`GenerationSpec`: sampling, stop tokens, the decoder's tools and prefill);
3. brings a fresh decoder and builder to where the log ends by replaying those tokens
   (``domain.continuation``), and
4. **continues** it: the engine gets the prompt plus the tokens generated so far
   (``Sampling.generated``), and the log goes on at the next ``seq`` as if nothing had happened.
   An audit record ``takeover`` says from which replica, to which, at which ``seq``.

Where it cannot continue (``RESPONSES_LEDGER_TAKEOVER=fail``, a response made before its
generation was recorded, a model this replica does not serve, a log that does not replay, no
room left in the context) the response is closed ``response.failed`` with code
``takeover_failed`` and a message that says why. Followers anywhere see the continuation (or the
terminal event): they read the log, woken by the doorbell.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.conversations import ConversationTurn
from app.engines.protocol import Sampling
from app.live import Run
from app.logprobs import token_texts
from domain.builder import ResponseBuilder
from domain.continuation import CannotReplay, replay
from domain.decoder import HarmonyDecoder
from domain.events import Event
from domain.projections import from_wire
from domain.prompt import RenderedPrompt
from persistence.records import AuditRecord

if TYPE_CHECKING:
    from app.service import ResponseService

__all__ = ["TAKEOVER_FAILED", "GenerationSpec", "Resumed", "Takeovers"]

log = logging.getLogger(__name__)

#: ``error.code`` of a response whose owner stopped and that could not be continued.
TAKEOVER_FAILED = "takeover_failed"


@dataclass(frozen=True)
class GenerationSpec:
    """How a response is being generated, beyond its prompt: what a takeover needs to go on
    with it elsewhere. Kept as the ``detail`` of its ``prompt_token_ids`` audit record."""

    sampling: Sampling
    custom_tools: tuple[str, ...] = ()
    prefill: tuple[int, ...] = ()
    function_names: dict[str, tuple[str, str | None]] = dataclasses.field(default_factory=dict)
    #: ``tool_choice`` required or named: a turn without a call ends failed.
    forced_call: bool = False
    encrypt_reasoning: bool = False

    @classmethod
    def of(
        cls, rendered: RenderedPrompt, sampling: Sampling, *, encrypt_reasoning: bool
    ) -> GenerationSpec:
        return cls(
            sampling=sampling,
            custom_tools=tuple(rendered.custom_names),
            prefill=tuple(rendered.prefill.token_ids) if rendered.prefill else (),
            function_names={
                t.model_name: (t.name, t.namespace)
                for t in rendered.tools
                if t.type == "function" and t.namespace is not None
            },
            forced_call=rendered.prefill is not None,
            encrypt_reasoning=encrypt_reasoning,
        )

    def decoder(self, encoding: Any, builder: ResponseBuilder) -> HarmonyDecoder:
        return HarmonyDecoder(
            encoding,
            builder,
            custom_tools=self.custom_tools,
            prefill=self.prefill,
            function_names=self.function_names,
            logprobs=token_texts(encoding) if self.sampling.logprobs is not None else None,
        )

    def to_json(self) -> dict[str, Any]:
        s = self.sampling
        return {
            "sampling": {
                "max_tokens": s.max_tokens,
                "temperature": s.temperature,
                "top_p": s.top_p,
                "seed": s.seed,
                "presence_penalty": s.presence_penalty,
                "frequency_penalty": s.frequency_penalty,
                "stop_token_ids": list(s.stop_token_ids),
                "grammar": s.grammar,
                "logprobs": s.logprobs,
            },
            "custom_tools": list(self.custom_tools),
            "prefill": list(self.prefill),
            "function_names": {k: list(v) for k, v in self.function_names.items()},
            "forced_call": self.forced_call,
            "encrypt_reasoning": self.encrypt_reasoning,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GenerationSpec:
        s = data["sampling"]
        return cls(
            sampling=Sampling(
                max_tokens=s["max_tokens"],
                temperature=s["temperature"],
                top_p=s["top_p"],
                seed=s["seed"],
                # (absent from the records of servers that predate the penalties)
                presence_penalty=s.get("presence_penalty"),
                frequency_penalty=s.get("frequency_penalty"),
                stop_token_ids=tuple(s["stop_token_ids"]),
                grammar=s.get("grammar"),
                logprobs=s.get("logprobs"),  # absent in specs recorded before logprobs
            ),
            custom_tools=tuple(data["custom_tools"]),
            prefill=tuple(data["prefill"]),
            function_names={k: (v[0], v[1]) for k, v in data["function_names"].items()},
            forced_call=bool(data["forced_call"]),
            encrypt_reasoning=bool(data["encrypt_reasoning"]),
        )


@dataclass
class Resumed:
    """A log to go on with (``ResponseService._generate``)."""

    builder: ResponseBuilder
    decoder: HarmonyDecoder
    #: The prompt as first sent to the engine, and how it was being generated.
    prompt_ids: list[int]
    spec: GenerationSpec
    #: Why its owner gave it up ("the server restarted", ...).
    reason: str
    #: The output token ids behind the logged events.
    tokens: list[int]
    #: Events the replay made past the log's end: appended first.
    pending: list[Event]
    next_seq: int
    #: The ``takeover`` audit record.
    audit: AuditRecord
    #: ``stop``/``length`` when nothing is left to generate (the last logged token was a stop
    #: token, or ``max_tokens`` is used up); None to ask the engine for more.
    finish_reason: str | None = None
    #: The conversation turn it appends when it ends (``Conversations.turn_of``).
    turn: ConversationTurn | None = None


class CannotContinue(Exception):
    """Why a taken-over response is closed instead of continued."""


class Takeovers:
    """Claims orphaned responses for this replica and continues (or closes) them."""

    def __init__(
        self, service: ResponseService, *, mode: str, new_id: Callable[[str], str]
    ) -> None:
        self._service = service
        self._mode = mode
        self._new_id = new_id
        #: Totals since start (for the operators' page and the benchmarks).
        self.continued = 0
        self.failed = 0

    async def take(self, response_id: str, from_owner: str | None, why: str) -> bool:
        """Claim ``response_id`` from ``from_owner`` and continue it (or close it ``failed``).
        False if another replica claimed it first (or it ended meanwhile). Raises
        ``StoreError`` if the database failed (the claim may stand: the next sweep retries)."""
        service = self._service
        if service.drain.draining:
            return False  # leaving: the other replicas take it
        epoch = await service.store.claim(response_id, from_owner, service.replica.id)
        if epoch is None:
            return False
        if self._mode != "continue":  # RESPONSES_LEDGER_TAKEOVER=fail: closed as before takeovers
            await service.repairs.close(response_id, {"code": "server_error", "message": why}, None)
            self.failed += 1
            log.warning("response %s: closed, nobody was generating it (%s)", response_id, why)
            return True
        try:
            resumed, run = await self._prepare(response_id, from_owner, epoch, why)
        except CannotContinue as exc:
            error = {"code": TAKEOVER_FAILED, "message": str(exc)}
            await service.repairs.close(response_id, error, None)
            self.failed += 1
            log.warning("response %s: closed, it could not be continued (%s)", response_id, exc)
            return True
        service.launch(
            run,
            service._generate(
                run,
                resumed.builder,
                None,
                resumed.prompt_ids,
                resumed.spec.sampling,
                forced_call=resumed.spec.forced_call,
                resumed=resumed,
                turn=resumed.turn,
            ),
        )
        self.continued += 1
        log.warning(
            "response %s: taken over from %s at seq %d (%s)",
            response_id,
            from_owner,
            resumed.next_seq,
            why,
        )
        return True

    async def _prepare(
        self, response_id: str, from_owner: str | None, epoch: int, why: str
    ) -> tuple[Resumed, Run]:
        service = self._service
        store = service.store
        events = [from_wire(e.type, e.seq, e.payload) for e in await store.load(response_id)]
        row = await store.get(response_id)
        if row is None:
            raise CannotContinue("it was deleted")
        if row.model not in service.engine.model_names:
            raise CannotContinue(f"{why}, and this server does not serve its model {row.model!r}")
        audit = await store.load_audit(response_id)
        prompt = next((a for a in audit if a.kind == "prompt_token_ids"), None)
        if prompt is None or prompt.detail is None:
            raise CannotContinue(f"{why} before its prompt was recorded")
        spec = GenerationSpec.from_json(prompt.detail)
        writes = await store.output_token_writes(response_id)
        tokens = [token for write in writes for token in write]
        encrypt = service.cipher.encrypt if spec.encrypt_reasoning else None
        try:
            replayed = replay(
                events,
                writes,
                new_decoder=lambda builder: spec.decoder(service.encoding, builder),
                new_id=self._new_id,
                encrypt_reasoning=encrypt,
                coalesce=service.settings.coalesce_deltas,
            )
        except CannotReplay as exc:
            raise CannotContinue(f"{why}, and its log could not be replayed: {exc}") from None
        prompt_ids = list(prompt.token_ids)
        finish: str | None = None
        if tokens and tokens[-1] in spec.sampling.stop_token_ids:
            finish = "stop"
        elif spec.sampling.max_tokens is not None and len(tokens) >= spec.sampling.max_tokens:
            finish = "length"
        if finish is None and spec.sampling.grammar is not None and tokens:
            # vLLM would start the grammar again at the continuation's first token
            raise CannotContinue(
                f"{why}, and its output is held to a grammar that cannot resume mid-turn"
            )
        limit = service.engine.max_model_len
        if finish is None and limit is not None and len(prompt_ids) + len(tokens) >= limit:
            raise CannotContinue(f"{why}, and its context is full ({limit} tokens)")
        next_seq = len(events)
        record = AuditRecord(
            "takeover",
            detail={
                "from_replica": from_owner,
                "to_replica": service.replica.id,
                "at_seq": next_seq,
                "epoch": epoch,
                "output_tokens": len(tokens),
                "reason": why,
                "at": time.time(),
            },
        )
        run = Run(
            id=response_id,
            store=True,
            background=row.background,
            engine_request_id=f"{response_id}-{epoch}",
            model=row.model,
        )
        if row.cancel_requested_at is not None and row.background:
            # cancelled through another replica before its owner could act on it
            finish, run.cancel_requested = "abort", True
        resumed = Resumed(
            replayed.builder,
            replayed.decoder,
            prompt_ids,
            spec,
            why,
            tokens,
            replayed.pending,
            next_seq,
            record,
            finish,
            await service.conversations.turn_of(row),
        )
        run.published = True  # its first events were published by the replica that made them
        run.created.set()
        return resumed, run
