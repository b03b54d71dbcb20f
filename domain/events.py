"""The events of a response's log, as values.

One frozen dataclass per OpenAI Responses stream event that a gpt-oss server produces. Field names
and shapes are exactly those of the ``openai.types.responses`` models of the pinned ``openai``
package (3.57.0): an event's wire form is ``{"type": ..., <fields>}`` and validates against
``ResponseStreamEvent``. ``sequence_number`` is the event's ``seq`` in the log.

Nested objects (the ``response`` of lifecycle events, the ``item`` of item events, the ``part`` of
content-part events) are kept in their wire (JSON) shape: they are built by :mod:`domain.builder`
and only ever read back as data.

How a cancelled stream ends: OpenAI's stream event union has no cancellation event (its webhook
for the same moment is named ``response.cancelled``). A cancelled response's log ends with
:class:`ResponseCancelled`, type ``response.cancelled``, whose ``response.status`` is
``"cancelled"``: the log says what happened. On the wire it is sent as ``response.incomplete``
(same payload, ``status`` still ``"cancelled"``; see :mod:`domain.projections`), the terminal the
OpenAI SDK types and accumulates, and ``GET`` returns the cancelled Response.

Audit records (:class:`PromptTokens`, :class:`OutputTokens`, :class:`EngineFinished`) are not
stream events: they never take a ``sequence_number`` and are never sent to stream clients.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias, TypeVar

__all__ = [
    "LIFECYCLE_TYPES",
    "TERMINAL_TYPES",
    "AuditRecord",
    "CompactionCompacting",
    "ContentPartAdded",
    "ContentPartDone",
    "CustomToolCallInputDelta",
    "CustomToolCallInputDone",
    "EngineFinished",
    "Event",
    "FunctionCallArgumentsDelta",
    "FunctionCallArgumentsDone",
    "Json",
    "OutputItemAdded",
    "OutputItemDone",
    "OutputTextDelta",
    "OutputTextDone",
    "OutputTokens",
    "PromptTokens",
    "ReasoningTextDelta",
    "ReasoningTextDone",
    "ResponseCancelled",
    "ResponseCompleted",
    "ResponseCreated",
    "ResponseFailed",
    "ResponseInProgress",
    "ResponseIncomplete",
    "ResponseQueued",
    "Terminal",
    "copy_json",
    "event_class",
    "fast_init",
]

Json: TypeAlias = dict[str, Any]


_T = TypeVar("_T")


#: The leaves of JSON-shaped data, which a copy shares (they are immutable).
_SCALARS = frozenset({str, int, float, bool, type(None)})


def copy_json(value: _T) -> _T:
    """A deep copy of JSON-shaped data (dicts, lists, tuples of str/int/float/bool/None).

    What ``copy.deepcopy`` does for such data, several times faster (no memo, no dispatch
    table): snapshots of the Response are copied this way a few times per request. A leaf is
    taken as it is, without a call of its own (a response's snapshots made ~250 calls a
    response, most of them for leaves and ``typing.cast``)."""
    data: Any = value
    kind = type(data)
    copied: Any
    if kind is dict:
        copied = {
            key: item if type(item) in _SCALARS else copy_json(item) for key, item in data.items()
        }
    elif kind is list:
        copied = [item if type(item) in _SCALARS else copy_json(item) for item in data]
    elif kind is tuple:
        copied = tuple([item if type(item) in _SCALARS else copy_json(item) for item in data])
    else:
        return value
    result: _T = copied
    return result


# -- response lifecycle ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResponseCreated:
    type: ClassVar[str] = "response.created"
    sequence_number: int
    response: Json


@dataclass(frozen=True, slots=True)
class ResponseQueued:
    type: ClassVar[str] = "response.queued"
    sequence_number: int
    response: Json


@dataclass(frozen=True, slots=True)
class ResponseInProgress:
    type: ClassVar[str] = "response.in_progress"
    sequence_number: int
    response: Json


@dataclass(frozen=True, slots=True)
class ResponseCompleted:
    type: ClassVar[str] = "response.completed"
    sequence_number: int
    response: Json


@dataclass(frozen=True, slots=True)
class ResponseIncomplete:
    type: ClassVar[str] = "response.incomplete"
    sequence_number: int
    response: Json


@dataclass(frozen=True, slots=True)
class ResponseFailed:
    type: ClassVar[str] = "response.failed"
    sequence_number: int
    response: Json


@dataclass(frozen=True, slots=True)
class ResponseCancelled:
    type: ClassVar[str] = "response.cancelled"
    sequence_number: int
    response: Json


# -- items -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OutputItemAdded:
    type: ClassVar[str] = "response.output_item.added"
    sequence_number: int
    output_index: int
    item: Json


@dataclass(frozen=True, slots=True)
class OutputItemDone:
    type: ClassVar[str] = "response.output_item.done"
    sequence_number: int
    output_index: int
    item: Json


@dataclass(frozen=True, slots=True)
class ContentPartAdded:
    type: ClassVar[str] = "response.content_part.added"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    part: Json


@dataclass(frozen=True, slots=True)
class ContentPartDone:
    type: ClassVar[str] = "response.content_part.done"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    part: Json


# -- deltas and their done events ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OutputTextDelta:
    type: ClassVar[str] = "response.output_text.delta"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: tuple[Json, ...] = ()


@dataclass(frozen=True, slots=True)
class OutputTextDone:
    type: ClassVar[str] = "response.output_text.done"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: tuple[Json, ...] = ()


@dataclass(frozen=True, slots=True)
class ReasoningTextDelta:
    type: ClassVar[str] = "response.reasoning_text.delta"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: str


@dataclass(frozen=True, slots=True)
class ReasoningTextDone:
    type: ClassVar[str] = "response.reasoning_text.done"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    text: str


@dataclass(frozen=True, slots=True)
class FunctionCallArgumentsDelta:
    type: ClassVar[str] = "response.function_call_arguments.delta"
    sequence_number: int
    item_id: str
    output_index: int
    delta: str


@dataclass(frozen=True, slots=True)
class FunctionCallArgumentsDone:
    type: ClassVar[str] = "response.function_call_arguments.done"
    sequence_number: int
    item_id: str
    output_index: int
    arguments: str
    #: The function's name: required by OpenAI's OpenAPI document (not by the SDK model).
    name: str = ""


@dataclass(frozen=True, slots=True)
class CustomToolCallInputDelta:
    type: ClassVar[str] = "response.custom_tool_call_input.delta"
    sequence_number: int
    item_id: str
    output_index: int
    delta: str


@dataclass(frozen=True, slots=True)
class CustomToolCallInputDone:
    type: ClassVar[str] = "response.custom_tool_call_input.done"
    sequence_number: int
    item_id: str
    output_index: int
    input: str


@dataclass(frozen=True, slots=True)
class CompactionCompacting:
    """The model is writing a compaction item's summary (it carries none of it)."""

    type: ClassVar[str] = "response.compaction.compacting"
    sequence_number: int
    item_id: str
    output_index: int


Terminal: TypeAlias = ResponseCompleted | ResponseIncomplete | ResponseFailed | ResponseCancelled

Event: TypeAlias = (
    ResponseCreated
    | ResponseQueued
    | ResponseInProgress
    | ResponseCompleted
    | ResponseIncomplete
    | ResponseFailed
    | ResponseCancelled
    | OutputItemAdded
    | OutputItemDone
    | ContentPartAdded
    | ContentPartDone
    | OutputTextDelta
    | OutputTextDone
    | ReasoningTextDelta
    | ReasoningTextDone
    | FunctionCallArgumentsDelta
    | FunctionCallArgumentsDone
    | CustomToolCallInputDelta
    | CustomToolCallInputDone
    | CompactionCompacting
)

_CLASSES: dict[str, type[Any]] = {
    cls.type: cls
    for cls in (
        ResponseCreated,
        ResponseQueued,
        ResponseInProgress,
        ResponseCompleted,
        ResponseIncomplete,
        ResponseFailed,
        ResponseCancelled,
        OutputItemAdded,
        OutputItemDone,
        ContentPartAdded,
        ContentPartDone,
        OutputTextDelta,
        OutputTextDone,
        ReasoningTextDelta,
        ReasoningTextDone,
        FunctionCallArgumentsDelta,
        FunctionCallArgumentsDone,
        CustomToolCallInputDelta,
        CustomToolCallInputDone,
        CompactionCompacting,
    )
}


def fast_init(cls: type[Any]) -> None:
    """Give a frozen slots dataclass an ``__init__`` that sets each slot through its descriptor.

    The generated one goes through ``object.__setattr__`` field by field (frozen dataclasses
    must), which made building an ``OutputTextDelta`` about 0.9 µs, one of the larger costs of a
    streamed token; this one takes about 0.4 µs. Same signature and defaults, and the instance
    is as frozen as before (assignment still raises ``FrozenInstanceError``)."""
    namespace: dict[str, Any] = {}
    params: list[str] = []
    body: list[str] = []
    for i, f in enumerate(dataclasses.fields(cls)):
        namespace[f"_set{i}"] = cls.__dict__[f.name].__set__
        if f.default is not dataclasses.MISSING:
            namespace[f"_default{i}"] = f.default
            params.append(f"{f.name}=_default{i}")
        elif f.default_factory is not dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{f.name}: default_factory is not supported")
        else:
            params.append(f.name)
        body.append(f"    _set{i}(self, {f.name})")
    exec(f"def __init__(self, {', '.join(params)}):\n" + "\n".join(body), namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = init


for _cls in _CLASSES.values():
    fast_init(_cls)

TERMINAL_TYPES = frozenset(
    {ResponseCompleted.type, ResponseIncomplete.type, ResponseFailed.type, ResponseCancelled.type}
)
LIFECYCLE_TYPES = frozenset(
    {ResponseCreated.type, ResponseQueued.type, ResponseInProgress.type} | TERMINAL_TYPES
)


def event_class(type_: str) -> type[Any]:
    """The event class for a stored ``type`` string; KeyError for an unknown type."""
    return _CLASSES[type_]


# -- audit records -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PromptTokens:
    """The exact prompt token ids given to the engine."""

    kind: ClassVar[str] = "prompt_token_ids"
    token_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class OutputTokens:
    """The raw token ids the engine produced, before any parsing."""

    kind: ClassVar[str] = "output_token_ids"
    token_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class EngineFinished:
    """Why generation stopped, and whether malformed output had to be recovered."""

    kind: ClassVar[str] = "finish"
    finish_reason: str
    recovered: bool = False
    detail: str | None = None


AuditRecord: TypeAlias = PromptTokens | OutputTokens | EngineFinished
