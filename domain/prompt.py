"""A request's conversation -> Harmony prompt token ids (the input direction of the translation).

:func:`render_prompt` takes the request's instructions, tools, tool choice and reasoning effort,
and the whole conversation as Responses input items (for a ``previous_response_id`` chain, the
chain's inputs and outputs followed by the new input), and renders them with ``openai_harmony``:

- **system**: model identity, knowledge cutoff, current date, reasoning effort and the valid
  channels (``analysis``, ``commentary``, ``final``); Harmony adds "Calls to these tools must go to
  the commentary channel: 'functions'." when function tools are offered.
- **developer**: ``instructions`` under ``# Instructions``, then the offered tools as the
  ``functions`` namespace with their JSON schemas.
- the conversation, then ``<|start|>assistant``.

Decisions, where the Responses API and Harmony do not line up:

- Role ``system`` input messages are *merged into the developer instructions* (after
  ``instructions``, in order, separated by a blank line): gpt-oss reserves the system message for
  model metadata. Their position in the conversation is not kept.
- Role ``developer`` input messages stay *developer messages* where they stand (openai_harmony
  renders any number of them, each as ``# Instructions``), so they keep their rank above user text
  instead of being folded into system text that later user text overrides.
- Content parts are concatenated in order with nothing in between, as Harmony renders a message's
  several text contents; every text part is kept (``input_text``, ``output_text``, ``refusal``). A
  text model cannot see ``input_image`` / ``input_file`` parts: each becomes a placeholder,
  ``[image omitted]`` or ``[file omitted: NAME]`` (any other unknown part: ``[TYPE omitted]``), so
  the model knows something was there and the request never fails for it.
- An assistant ``message`` goes to the ``final`` channel, or to ``commentary`` (without recipient:
  a preamble) when its ``phase`` is ``"commentary"``.
- ``reasoning`` items go to the ``analysis`` channel. An item that carries ``encrypted_content``
  is rendered from the decrypted blob, whatever plaintext it also carries, and a blob that does
  not verify fails the request: the server returns reasoning items with both, and a client
  replaying one with edited text must not get its edit into the prompt. An item without a blob
  (a client's own history) is rendered from ``content`` (parts concatenated), else ``summary``
  (parts joined by a blank line).
- A ``compaction`` item renders as a user message holding its decrypted summary (a blob that does
  not verify fails the request), and the latest one stands for everything before it but the user
  messages (:mod:`domain.compaction`). A ``compaction_trigger`` never renders (the service acts on
  it before); one that is not the last input item is refused.
- gpt-oss reasoning convention: analysis before the last final-channel assistant message is
  dropped (that turn is over); analysis after it (a turn still working through tool calls) is
  kept. Harmony's own ``auto_drop_analysis`` is switched off so the rule is this one, stated here.
- Only ``function``, ``custom`` and ``namespace`` tools can be offered (:data:`OFFERED_TOOL_TYPES`);
  any other type (a hosted tool, ``web_search``, ``mcp``, ...: nothing here would run it) is an
  :class:`InvalidInput` naming ``tools[i].type``, never silently left out.
  ``namespace`` tools are flattened into the ``functions`` namespace: a member's model-visible name
  is Codex's ``nested_tool_public_name`` (``mcp__docs__`` + ``search`` -> ``mcp__docs__search``,
  ``crm`` + ``lookup`` -> ``crm_lookup``), with ``_2``, ``_3``... on a clash, and the namespace
  description opens the member's description. :attr:`RenderedPrompt.tools` maps each
  model-visible name back to the declared ``(namespace, name)`` so a call is returned as the client
  declared it. ``defer_loading`` functions are offered directly (there is no tool search).
- Custom tools are offered as functions taking ``{"input": string}`` (see
  :mod:`domain.custom_tools`); ``custom_tool_call`` items are replayed as those function calls.
- A named ``tool_choice`` pre-fills the assistant header so the model can only write that call:
  the prompt ends with ``<|start|>assistant<|channel|>commentary to=functions.NAME
  <|constrain|>json<|message|>`` -- the header as gpt-oss itself writes a tool call -- and
  :attr:`RenderedPrompt.prefill` says so (the decoder must start inside that message).
  ``"required"`` is validated (there must be a tool to call) but not forced by the prompt.
"""

from __future__ import annotations

import functools
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    HarmonyEncoding,
    Message,
    ReasoningEffort,
    RenderConversationConfig,
    Role,
    SystemContent,
    ToolDescription,
)

from domain.compaction import SUMMARY_HEADER, superseded
from domain.custom_tools import custom_grammar, custom_tool_as_function, encode_custom_input
from domain.errors import InvalidInput

__all__ = [
    "DEFAULT_KNOWLEDGE_CUTOFF",
    "DEFAULT_MODEL_IDENTITY",
    "OFFERED_TOOL_TYPES",
    "OfferedTool",
    "Prefill",
    "PromptRequest",
    "RenderedPrompt",
    "ToolChoice",
    "render_prompt",
    "validate_tool_choice",
]

DEFAULT_MODEL_IDENTITY = "You are ChatGPT, a large language model trained by OpenAI."
DEFAULT_KNOWLEDGE_CUTOFF = "2024-06"

Item: TypeAlias = Mapping[str, object]

_CHANNELS = ["analysis", "commentary", "final"]
#: The tool types a prompt can offer (a ``namespace`` holds functions and custom tools).
OFFERED_TOOL_TYPES = ("function", "custom", "namespace")
_JSON_CONSTRAINT = "<|constrain|>json"
_EFFORTS = {
    None: ReasoningEffort.MEDIUM,
    "low": ReasoningEffort.LOW,
    "medium": ReasoningEffort.MEDIUM,
    "high": ReasoningEffort.HIGH,
    # gpt-oss has three levels and cannot switch reasoning off: the other wire values map to the
    # nearest one instead of failing a client that sends them.
    "none": ReasoningEffort.LOW,
    "minimal": ReasoningEffort.LOW,
    "xhigh": ReasoningEffort.HIGH,
    "max": ReasoningEffort.HIGH,
}
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "reasoning_text", "summary_text"})


@dataclass(frozen=True)
class PromptRequest:
    """Everything :func:`render_prompt` needs, already taken off the wire.

    ``items`` is the whole conversation in order: wire input items (``EasyInputMessage`` with or
    without ``"type"``, output items replayed by clients) or stored output items; a plain string is
    one user message. The first ``history_length`` items are a ``previous_response_id`` chain
    replayed by the service: errors in them name ``previous_response_id``, errors after them
    ``input[i]`` counted from the request's own input.
    """

    instructions: str | None = None
    items: str | Sequence[Item] = ()
    tools: Sequence[Item] = ()
    tool_choice: object = None
    #: ``"low" | "medium" | "high"``; None means medium (``none``/``minimal``/``xhigh``/``max`` map
    #: to the nearest level).
    reasoning_effort: str | None = None
    knowledge_cutoff: str | None = DEFAULT_KNOWLEDGE_CUTOFF
    #: ``YYYY-MM-DD``, from the caller's clock; None leaves the line out.
    current_date: str | None = None
    model_identity: str = DEFAULT_MODEL_IDENTITY
    history_length: int = 0
    #: Turns a reasoning item's ``encrypted_content`` back into its text.
    decrypt: Callable[[str], str] | None = None
    #: Turns a ``compaction`` item's ``encrypted_content`` back into its summary.
    decrypt_compaction: Callable[[str], str] | None = None
    #: Looks up the item an ``item_reference`` names; None (or LookupError) when there is none.
    resolve_reference: Callable[[str], Item | None] | None = None
    #: ``text.format`` when it is ``json_schema`` or ``json_object``: shown to the model in the
    #: developer message's ``# Response Formats`` section, as gpt-oss was trained.
    response_format: Mapping[str, object] | None = None


@dataclass(frozen=True)
class OfferedTool:
    """A tool the model sees in the ``functions`` namespace, and what it stands for."""

    #: The name the model calls: recipient ``functions.<model_name>``.
    model_name: str
    type: Literal["function", "custom"]
    #: The name as declared (a namespace member's own name).
    name: str
    #: The declaring ``namespace`` tool's name, or None for a top-level tool.
    namespace: str | None
    description: str
    parameters: Mapping[str, object] | None = field(default=None, compare=False)
    #: The declaration's parameter path (``tools[3]``, ``tools[2].tools[0]``).
    param: str = field(default="tools", compare=False)
    #: A function whose arguments are held to its schema (OpenAI's default: true).
    strict: bool = field(default=False, compare=False)
    #: A custom tool's grammar, ``(syntax, definition)`` with syntax ``lark`` or ``regex``: its
    #: payload is written raw (no JSON envelope) and held to the grammar.
    grammar: tuple[str, str] | None = field(default=None, compare=False)

    @property
    def recipient(self) -> str:
        return f"functions.{self.model_name}"


@dataclass(frozen=True)
class ToolChoice:
    """A validated ``tool_choice``.

    ``mode`` is ``auto``, ``none``, ``required`` or ``named`` (``tool`` is then the one to call).
    ``allowed`` holds the model-visible names of an ``allowed_tools`` choice (None: all tools).
    """

    mode: Literal["auto", "none", "required", "named"]
    tool: OfferedTool | None = None
    allowed: frozenset[str] | None = None


@dataclass(frozen=True)
class Prefill:
    """The assistant header already written at the end of the prompt (a forced ``tool_choice``).

    The prompt ends with ``<|start|>assistant`` + :attr:`text`. For a named choice generation
    starts inside the message's content, on :attr:`channel`, addressed to :attr:`recipient`. For
    ``required`` the header stops at ``to=functions.`` (:attr:`tool` is None, :attr:`recipient`
    is ``"functions."``): the model writes the name of the tool it calls, and cannot write an
    answer instead. Upstream (SGLang) forces named and required choices down the same path; the
    price is that the model starts with the call, without an analysis message first.
    """

    channel: str
    recipient: str
    content_type: str
    text: str
    token_ids: tuple[int, ...]
    tool: OfferedTool | None


@dataclass(frozen=True)
class RenderedPrompt:
    token_ids: list[int]
    #: ``<|return|>`` and ``<|call|>`` (ascending ids): where an assistant turn ends.
    stop_token_ids: tuple[int, ...]
    #: Offered tools, in the order the model sees them.
    tools: tuple[OfferedTool, ...]
    tool_choice: ToolChoice
    prefill: Prefill | None = None

    @property
    def function_names(self) -> frozenset[str]:
        """Model-visible names of the offered function tools."""
        return frozenset(t.model_name for t in self.tools if t.type == "function")

    @property
    def custom_names(self) -> frozenset[str]:
        """Model-visible names of the offered custom tools."""
        return frozenset(t.model_name for t in self.tools if t.type == "custom")

    def tool_for(self, recipient: str) -> OfferedTool | None:
        """The offered tool a recipient (``functions.NAME``, or the bare ``NAME``) addresses."""
        name = recipient.removeprefix("functions.")
        return next((t for t in self.tools if t.model_name == name), None)


# -- tools ---------------------------------------------------------------------------------------


def _namespaced_name(namespace: str, name: str) -> str:
    """Codex's ``nested_tool_public_name``: the flat name of a namespace member."""
    if namespace.endswith("_") or name.startswith("_"):
        return namespace + name
    return f"{namespace}_{name}"


def _is_plain_namespace(namespace: object) -> bool:
    # Codex writes Harmony's own namespace, "functions", for top-level tools.
    return namespace is None or namespace in ("", "functions")


@dataclass(frozen=True)
class _Catalog:
    tools: tuple[OfferedTool, ...]

    def by_declared(self, namespace: str | None, name: str) -> OfferedTool | None:
        return next((t for t in self.tools if t.namespace == namespace and t.name == name), None)

    def tool_called(self, namespace: object, name: str) -> OfferedTool | None:
        """The offered tool a call to ``name`` (in ``namespace``) addresses, if it is offered."""
        if not _is_plain_namespace(namespace):
            return self.by_declared(str(namespace), name)
        return self.by_declared(None, name) or self.by_declared("functions", name)

    def model_name(self, namespace: object, name: str) -> str:
        """The model-visible name of a call to ``name`` (in ``namespace``), offered or not."""
        if not _is_plain_namespace(namespace):
            found = self.by_declared(str(namespace), name)
            return found.model_name if found is not None else _namespaced_name(str(namespace), name)
        found = self.by_declared(None, name) or self.by_declared("functions", name)
        return found.model_name if found is not None else name


def _catalog(tools: Sequence[Item]) -> _Catalog:
    if isinstance(tools, str | bytes) or not isinstance(tools, Sequence):
        raise InvalidInput("tools must be an array", param="tools", code="invalid_type")
    top: set[str] = set()
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise InvalidInput("A tool must be an object", param=f"tools[{i}]", code="invalid_type")
        if tool.get("type") in ("function", "custom"):
            name = _required_str(tool, "name", f"tools[{i}]")
            if name in top:
                raise InvalidInput(f"Duplicate tool name {name!r}", param=f"tools[{i}].name")
            top.add(name)
    used = set(top)
    offered: list[OfferedTool] = []
    for i, tool in enumerate(tools):
        kind = tool.get("type")
        if kind in ("function", "custom"):
            offered.append(_offered(tool, f"tools[{i}]", None, str(tool["name"]), None))
        elif kind == "namespace":
            namespace = _required_str(tool, "name", f"tools[{i}]")
            ns_description = tool.get("description")
            members = tool.get("tools")
            if not isinstance(members, Sequence) or isinstance(members, str | bytes):
                raise InvalidInput(
                    "A namespace tool needs a tools array",
                    param=f"tools[{i}].tools",
                    code="invalid_type",
                )
            for j, member in enumerate(members):
                param = f"tools[{i}].tools[{j}]"
                if not isinstance(member, Mapping):
                    raise InvalidInput("A tool must be an object", param=param, code="invalid_type")
                if member.get("type") not in ("function", "custom"):
                    raise _not_offered(member.get("type"), param, ("function", "custom"))
                name = _required_str(member, "name", param)
                model_name = _unique(_namespaced_name(namespace, name), used)
                prefix = ns_description if isinstance(ns_description, str) else None
                offered.append(_offered(member, param, namespace, model_name, prefix))
        else:
            raise _not_offered(kind, f"tools[{i}]", OFFERED_TOOL_TYPES)
    return _Catalog(tuple(offered))


def _not_offered(kind: object, param: str, supported: Sequence[str]) -> InvalidInput:
    return InvalidInput(
        f"Tool type {kind!r} cannot be offered to the model (nothing here runs it); "
        f"supported tool types: {', '.join(supported)}",
        param=f"{param}.type",
        code="unsupported_value",
    )


def _unique(name: str, used: set[str]) -> str:
    candidate, n = name, 1
    while candidate in used:
        n += 1
        candidate = f"{name}_{n}"
    used.add(candidate)
    return candidate


def _offered(
    tool: Item, param: str, namespace: str | None, model_name: str, prefix: str | None
) -> OfferedTool:
    name = _required_str(tool, "name", param)
    parameters: dict[str, object] | None
    strict, grammar = False, None
    if tool.get("type") == "custom":
        _, description, parameters = custom_tool_as_function(tool, param=param)
        kind: Literal["function", "custom"] = "custom"
        grammar = custom_grammar(tool)
    else:
        raw = tool.get("description")
        description = raw if isinstance(raw, str) else ""
        schema = tool.get("parameters")
        if schema is not None and not isinstance(schema, Mapping):
            raise InvalidInput(
                "Function parameters must be a JSON schema object",
                param=f"{param}.parameters",
                code="invalid_type",
            )
        parameters = dict(schema) if schema is not None else None
        kind = "function"
        strict = tool.get("strict") is not False
    if prefix and prefix.strip():
        description = f"{prefix.strip()}\n{description}" if description else prefix.strip()
    return OfferedTool(
        model_name, kind, name, namespace, description, parameters, param, strict, grammar
    )


def _match_named(catalog: _Catalog, kind: str, name: str) -> OfferedTool | None:
    same_kind = [t for t in catalog.tools if t.type == kind]
    exact = [t for t in same_kind if t.model_name == name]
    if exact:
        return exact[0]
    inner = [t for t in same_kind if t.namespace is not None and t.name == name]
    return inner[0] if len(inner) == 1 else None


def validate_tool_choice(tools: Sequence[Item], tool_choice: object) -> ToolChoice:
    """Check ``tool_choice`` against ``tools``; raise :class:`InvalidInput` (param ``tool_choice``).

    ``"required"`` needs a function or custom tool (built-in tool types cannot be offered, so they
    cannot be forced); a named choice must name a declared tool of that type (a namespace member by
    its model-visible name, or by its own name when that is unambiguous).
    """
    return _validate_tool_choice(_catalog(tools), tool_choice)


def _validate_tool_choice(catalog: _Catalog, tool_choice: object) -> ToolChoice:
    if tool_choice is None or tool_choice == "auto":
        return ToolChoice("auto")
    if tool_choice == "none":
        return ToolChoice("none")
    if tool_choice == "required":
        if not catalog.tools:
            raise InvalidInput(
                'tool_choice "required" needs at least one tool of type "function" or "custom"; '
                "built-in tool types cannot be forced",
                param="tool_choice",
            )
        return ToolChoice("required")
    if not isinstance(tool_choice, Mapping):
        raise InvalidInput(
            f"Unsupported tool_choice {tool_choice!r}", param="tool_choice", code="invalid_value"
        )
    kind = tool_choice.get("type")
    if kind in ("function", "custom"):
        name = tool_choice.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidInput(
                "A named tool_choice needs a name",
                param="tool_choice.name",
                code="missing_required_parameter",
            )
        tool = _match_named(catalog, str(kind), name)
        if tool is None:
            raise InvalidInput(
                f"tool_choice names {kind} tool {name!r}, which is not declared in tools",
                param="tool_choice",
            )
        return ToolChoice("named", tool=tool)
    if kind == "allowed_tools":
        mode = tool_choice.get("mode")
        entries = tool_choice.get("tools")
        if mode not in ("auto", "required") or not isinstance(entries, Sequence):
            raise InvalidInput(
                'allowed_tools needs mode "auto" or "required" and a tools array',
                param="tool_choice",
            )
        allowed: set[str] = set()
        for k, entry in enumerate(entries):
            if not isinstance(entry, Mapping) or entry.get("type") not in ("function", "custom"):
                continue  # a built-in tool: not offered anyway
            name = entry.get("name")
            tool = (
                _match_named(catalog, str(entry["type"]), name) if isinstance(name, str) else None
            )
            if tool is None:
                raise InvalidInput(
                    f"allowed_tools names {entry.get('type')} tool {name!r}, which is not declared in tools",
                    param=f"tool_choice.tools[{k}]",
                )
            allowed.add(tool.model_name)
        if mode == "required" and not allowed:
            raise InvalidInput(
                'allowed_tools with mode "required" needs a function or custom tool',
                param="tool_choice",
            )
        return ToolChoice("required" if mode == "required" else "auto", allowed=frozenset(allowed))
    raise InvalidInput(
        f"tool_choice of type {kind!r} cannot be used: only function and custom tools can be offered "
        "to this model",
        param="tool_choice",
    )


# -- items ---------------------------------------------------------------------------------------


def _required_str(item: Item, key: str, param: str) -> str:
    value = item.get(key)
    if value is None:
        raise InvalidInput(
            f"Missing {key!r}", param=f"{param}.{key}", code="missing_required_parameter"
        )
    if not isinstance(value, str):
        raise InvalidInput(f"{key!r} must be a string", param=f"{param}.{key}", code="invalid_type")
    return value


def _part_text(part: object, param: str) -> str:
    if isinstance(part, str):
        return part
    if not isinstance(part, Mapping):
        raise InvalidInput("A content part must be an object", param=param, code="invalid_type")
    kind = part.get("type")
    if kind in _TEXT_PARTS:
        return _required_str(part, "text", param)
    if kind == "refusal":
        return _required_str(part, "refusal", param)
    if kind == "input_image":
        return "[image omitted]"
    if kind == "input_file":
        filename = part.get("filename")
        return (
            f"[file omitted: {filename}]"
            if isinstance(filename, str) and filename
            else "[file omitted]"
        )
    if isinstance(kind, str):
        return f"[{kind} omitted]"
    raise InvalidInput(
        "A content part needs a type", param=f"{param}.type", code="missing_required_parameter"
    )


def _content_text(content: object, param: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, bytes):
        return "".join(_part_text(part, f"{param}[{k}]") for k, part in enumerate(content))
    if content is None:
        raise InvalidInput("Missing content", param=param, code="missing_required_parameter")
    raise InvalidInput(
        "content must be a string or an array of parts", param=param, code="invalid_type"
    )


def _parts_text(parts: object, separator: str, param: str) -> str:
    if not isinstance(parts, Sequence) or isinstance(parts, str | bytes):
        return ""
    return separator.join(_part_text(part, f"{param}[{k}]") for k, part in enumerate(parts))


class _Conversation:
    """Turns items into Harmony messages, remembering which tool each call_id went to."""

    def __init__(self, request: PromptRequest, catalog: _Catalog) -> None:
        self._request = request
        self._catalog = catalog
        self._call_names: dict[str, str] = {}
        self.system_texts: list[str] = []
        # (message, is analysis, is a final answer)
        self.messages: list[tuple[Any, bool, bool]] = []

    def add(self, item: object, param: str, *, resolved: bool = False) -> None:
        if not isinstance(item, Mapping):
            raise InvalidInput("An input item must be an object", param=param, code="invalid_type")
        kind = item.get("type")
        if kind is None and "role" in item:
            kind = "message"
        match kind:
            case "message":
                self._message(item, param)
            case "reasoning":
                self._reasoning(item, param)
            case "function_call":
                arguments = item.get("arguments")
                if isinstance(arguments, Mapping):
                    arguments = json.dumps(arguments, ensure_ascii=False)
                if not isinstance(arguments, str):
                    _required_str(item, "arguments", param)
                self._call(item, str(arguments), param)
            case "custom_tool_call":
                text = _required_str(item, "input", param)
                tool = self._catalog.tool_called(
                    item.get("namespace"), _required_str(item, "name", param)
                )
                if tool is not None and tool.grammar is not None:
                    self._call(item, text, param, raw=True)  # as the model writes it
                else:
                    self._call(item, encode_custom_input(text), param)
            case "function_call_output" | "custom_tool_call_output":
                self._output(item, param)
            case "compaction":
                self._compaction(item, param)
            case "compaction_trigger":
                raise InvalidInput(
                    "A compaction_trigger item must be the final input item.", param=f"{param}.type"
                )
            case "item_reference" if resolved:
                raise InvalidInput(
                    "An item_reference resolved to another item_reference", param=param
                )
            case "item_reference":
                self._reference(item, param)
            case None:
                raise InvalidInput(
                    "An input item needs a type",
                    param=f"{param}.type",
                    code="missing_required_parameter",
                )
            case _:
                raise InvalidInput(
                    f"Input items of type {kind!r} are not supported", param=f"{param}.type"
                )

    def _append(self, message: Any, *, analysis: bool = False, final: bool = False) -> None:
        self.messages.append((message, analysis, final))

    def _message(self, item: Item, param: str) -> None:
        role = item.get("role")
        text = _content_text(item.get("content"), f"{param}.content")
        if role == "user":
            self._append(Message.from_role_and_content(Role.USER, text))
        elif role == "assistant":
            if item.get("phase") == "commentary":
                self._append(
                    Message.from_role_and_content(Role.ASSISTANT, text).with_channel("commentary")
                )
            else:
                self._append(
                    Message.from_role_and_content(Role.ASSISTANT, text).with_channel("final"),
                    final=True,
                )
        elif role == "developer":
            content = DeveloperContent.new().with_instructions(text)
            self._append(Message.from_role_and_content(Role.DEVELOPER, content))
        elif role == "system":
            self.system_texts.append(text)
        else:
            raise InvalidInput(
                f"Unsupported message role {role!r}; expected user, assistant, system or developer",
                param=f"{param}.role",
            )

    def _reasoning(self, item: Item, param: str) -> None:
        text = _parts_text(item.get("content"), "", f"{param}.content")
        if not text:
            text = _parts_text(item.get("summary"), "\n\n", f"{param}.summary")
        encrypted = item.get("encrypted_content")
        if isinstance(encrypted, str) and encrypted:  # checked whenever present; it wins
            decrypt = self._request.decrypt
            if decrypt is None:
                raise InvalidInput(
                    "This reasoning item carries encrypted_content, which this server cannot "
                    "verify here",
                    param=f"{param}.encrypted_content",
                )
            try:
                text = decrypt(encrypted)
            except InvalidInput as exc:  # say which item it was
                raise InvalidInput(
                    exc.message, param=f"{param}.encrypted_content", code=exc.code
                ) from None
        if text:
            self._append(
                Message.from_role_and_content(Role.ASSISTANT, text).with_channel("analysis"),
                analysis=True,
            )

    def _compaction(self, item: Item, param: str) -> None:
        encrypted = item.get("encrypted_content")
        decrypt = self._request.decrypt_compaction
        if not isinstance(encrypted, str) or not encrypted:
            raise InvalidInput(
                "A compaction item needs its encrypted_content",
                param=f"{param}.encrypted_content",
                code="missing_required_parameter",
            )
        if decrypt is None:
            raise InvalidInput(
                "This compaction item cannot be verified here", param=f"{param}.encrypted_content"
            )
        try:
            summary = decrypt(encrypted)
        except InvalidInput as exc:
            raise InvalidInput(
                exc.message, param=f"{param}.encrypted_content", code=exc.code
            ) from None
        self._append(Message.from_role_and_content(Role.USER, SUMMARY_HEADER + summary))

    def _call(self, item: Item, arguments: str, param: str, *, raw: bool = False) -> None:
        name = _required_str(item, "name", param)
        call_id = _required_str(item, "call_id", param)
        model_name = self._catalog.model_name(item.get("namespace"), name)
        self._call_names[call_id] = model_name
        message = (
            Message.from_role_and_content(Role.ASSISTANT, arguments)
            .with_channel("commentary")
            .with_recipient(f"functions.{model_name}")
        )
        self._append(message if raw else message.with_content_type(_JSON_CONSTRAINT))

    def _output(self, item: Item, param: str) -> None:
        call_id = _required_str(item, "call_id", param)
        model_name = self._call_names.get(call_id)
        if model_name is None:
            raise InvalidInput(
                f"No tool call found for call_id {call_id!r}: its output must follow the call",
                param=f"{param}.call_id",
            )
        output = item.get("output")
        if isinstance(output, Mapping):
            text = json.dumps(output, ensure_ascii=False)
        else:
            text = _content_text(output, f"{param}.output")
        self._append(
            Message.from_author_and_content(Author.new(Role.TOOL, f"functions.{model_name}"), text)
            .with_channel("commentary")
            .with_recipient("assistant")
        )

    def _reference(self, item: Item, param: str) -> None:
        ref = _required_str(item, "id", param)
        resolve = self._request.resolve_reference
        if resolve is None:
            raise InvalidInput(
                f"item_reference {ref!r} cannot be resolved here", param=f"{param}.id"
            )
        try:
            target = resolve(ref)
        except LookupError:
            target = None
        if target is None:
            raise InvalidInput(f"No item found with id {ref!r}", param=f"{param}.id")
        self.add(target, param, resolved=True)

    def kept(self) -> list[Any]:
        """The messages, less the analysis of turns that ended in a final answer."""
        last_final = max((k for k, (_, _, final) in enumerate(self.messages) if final), default=-1)
        return [
            m
            for k, (m, analysis, _) in enumerate(self.messages)
            if not (analysis and k < last_final)
        ]


# -- rendering -----------------------------------------------------------------------------------


_STOP_TOKENS: dict[str, tuple[int, ...]] = {}


def response_formats_section(fmt: Mapping[str, object] | None) -> str | None:
    """The developer message's ``# Response Formats`` section for a ``text.format``, as the
    Harmony format specifies it: ``## name``, the description as a ``//`` comment, the schema."""
    if not fmt or fmt.get("type") not in ("json_schema", "json_object"):
        return None
    name: str = "json_object"
    description: object = "Any JSON object."
    schema: dict[str, object] = {"type": "object"}
    if fmt.get("type") == "json_schema":
        name, description = str(fmt.get("name") or "response"), fmt.get("description")
        given = fmt.get("schema")
        schema = dict(given) if isinstance(given, Mapping) else {}
    lines = ["# Response Formats", "", f"## {name}", ""]
    if isinstance(description, str) and description.strip():
        lines.extend(f"// {line}" for line in description.strip().splitlines())
    lines.append(json.dumps(schema, ensure_ascii=False, separators=(",", ":")))
    return "\n".join(lines)


def _stop_tokens(encoding: HarmonyEncoding) -> tuple[int, ...]:
    """The encoding's stop tokens for assistant actions, sorted (Harmony returns them from a hash
    set, in any order, so equal requests give equal prompts); asked once per encoding name."""
    stop = _STOP_TOKENS.get(encoding.name)
    if stop is None:
        stop = tuple(sorted(int(t) for t in encoding.stop_tokens_for_assistant_actions()))
        _STOP_TOKENS[encoding.name] = stop
    return stop


def _is_trigger(item: object) -> bool:
    return isinstance(item, Mapping) and item.get("type") == "compaction_trigger"


def render_prompt(encoding: HarmonyEncoding, request: PromptRequest) -> RenderedPrompt:
    """Render ``request`` into the prompt token ids for gpt-oss (see the module docstring)."""
    catalog = _catalog(request.tools)
    choice = _validate_tool_choice(catalog, request.tool_choice)
    if choice.mode == "none":
        offered: tuple[OfferedTool, ...] = ()
    elif choice.allowed is not None:
        offered = tuple(t for t in catalog.tools if t.model_name in choice.allowed)
    else:
        offered = catalog.tools

    if request.reasoning_effort not in _EFFORTS:
        raise InvalidInput(
            f"Unsupported reasoning effort {request.reasoning_effort!r}", param="reasoning.effort"
        )
    items: Sequence[object]
    if isinstance(request.items, str):
        items = [{"type": "message", "role": "user", "content": request.items}]
    else:
        items = request.items
    conversation = _Conversation(request, catalog)
    history = request.history_length
    skipped = superseded(items)  # what the latest compaction item stands for
    for index, item in enumerate(items):
        if index in skipped or (index < history and _is_trigger(item)):
            continue  # a trigger in the history was acted on when it was the input
        if index >= history:
            conversation.add(item, f"input[{index - history}]")
            continue
        try:
            conversation.add(item, f"history[{index}]")
        except InvalidInput as error:
            raise InvalidInput(
                f"The conversation of previous_response_id cannot be replayed: {error.message} "
                f"(at {error.param})",
                param="previous_response_id",
                code=error.code,
            ) from error

    instructions = [t for t in (request.instructions, *conversation.system_texts) if t]
    formats = response_formats_section(request.response_format)
    if formats:
        instructions.append(formats)
    instruction_text = "\n\n".join(instructions) if instructions else None
    # Everything the system and developer messages are made of, as one string: their tokens are
    # looked up by it, and the messages made only when it is new.
    head_key = json.dumps(
        [
            "head",
            request.model_identity,
            request.reasoning_effort,
            request.knowledge_cutoff,
            request.current_date,
            instruction_text,
            [[t.model_name, t.description, t.parameters] for t in offered],
        ],
        ensure_ascii=False,
    )

    def head() -> list[Message]:
        system = SystemContent(
            model_identity=request.model_identity,
            reasoning_effort=_EFFORTS[request.reasoning_effort],
            knowledge_cutoff=request.knowledge_cutoff,
            conversation_start_date=request.current_date,
        ).with_required_channels(list(_CHANNELS))
        messages = [Message.from_role_and_content(Role.SYSTEM, system)]
        if instruction_text is not None or offered:
            developer = DeveloperContent.new()
            if instruction_text is not None:
                developer = developer.with_instructions(instruction_text)
            if offered:
                developer = developer.with_function_tools(
                    [
                        ToolDescription.new(
                            t.model_name,
                            t.description,
                            dict(t.parameters) if t.parameters is not None else None,
                        )
                        for t in offered
                    ]
                )
            messages.append(Message.from_role_and_content(Role.DEVELOPER, developer))
        return messages

    token_ids = render_messages(encoding, head_key, head, conversation.kept())
    prefill = None
    if choice.mode == "named" and choice.tool is not None:
        prefill = _prefill(encoding, choice.tool)
        token_ids.extend(prefill.token_ids)
    elif choice.mode == "required":
        prefill = _required_prefill(encoding)
        token_ids.extend(prefill.token_ids)
    stop = _stop_tokens(encoding)
    return RenderedPrompt(
        token_ids=token_ids,
        stop_token_ids=stop,
        tools=offered,
        tool_choice=choice,
        prefill=prefill,
    )


#: Rendered token ids by (encoding, message JSON), least recently used first: openai-harmony
#: spends 80-110 µs on every message it renders whatever its length (measured: "Write a long
#: story." 81 µs alone; an 8-message conversation 0.88 ms), so without this each turn of a
#: conversation paid again for its whole history. The key is the whole message, so a hit is the
#: same message and renders to the same tokens.
#: It is used from the event loop and from the worker threads that render large requests, so
#: every look-up and insertion holds :data:`_RENDERED_LOCK` (rendering itself does not). A
#: message whose JSON is longer than :data:`_RENDERED_MAX_KEY` is rendered each time and not
#: kept: 8,192 such entries (a key and a tuple of token ids each) would not fit in memory.
_RENDERED: OrderedDict[tuple[str, str], tuple[int, ...]] = OrderedDict()
_RENDERED_MAX = 8192
_RENDERED_MAX_KEY = 64 * 1024
_RENDERED_LOCK = threading.Lock()
_RENDER_CONFIG = RenderConversationConfig(auto_drop_analysis=False)


def render_messages(
    encoding: HarmonyEncoding,
    head_key: str,
    head: Callable[[], Sequence[Message]],
    messages: Sequence[Message],
) -> list[int]:
    """What ``encoding.render_conversation_for_completion([*head(), *messages], assistant)``
    returns (with Harmony's ``auto_drop_analysis`` off), each message rendered once and then
    looked up.

    ``head()`` (system, and developer when there is one) is rendered as one conversation (the
    system message's text depends on the developer message: the line about function tools),
    looked up by ``head_key``, which says everything the head is made of, so that ``head()`` is
    called only when it is new. The rest render the same alone as inside the conversation, and
    the conversation then ends with ``<|start|>assistant``; tests hold this against Harmony's own
    rendering of whole conversations."""
    name = encoding.name
    token_ids = list(
        _rendered(
            (name, head_key),
            lambda: encoding.render_conversation(
                Conversation.from_messages(list(head())), _RENDER_CONFIG
            ),
        )
    )
    for message in messages:
        if _text_length(message) > _RENDERED_MAX_KEY:  # not kept: do not even write its key
            token_ids.extend(encoding.render(message))
            continue
        token_ids.extend(
            _rendered((name, message.to_json()), functools.partial(encoding.render, message))
        )
    token_ids.extend(
        _rendered(
            (name, "<|start|>assistant"),
            lambda: encoding.render_conversation_for_completion(
                Conversation.from_messages([]), Role.ASSISTANT, _RENDER_CONFIG
            ),
        )
    )
    return token_ids


def forget_rendered() -> None:
    """Empty the cache of rendered messages (benchmarks time the cold path with it)."""
    with _RENDERED_LOCK:
        _RENDERED.clear()


def _text_length(message: Message) -> int:
    return sum(
        len(text)
        for part in message.content
        if isinstance(text := getattr(part, "text", None), str)
    )


def _rendered(key: tuple[str, str], render: Callable[[], Sequence[int]]) -> tuple[int, ...]:
    if len(key[1]) > _RENDERED_MAX_KEY:
        return tuple(map(int, render()))
    with _RENDERED_LOCK:
        found = _RENDERED.get(key)
        if found is not None:
            _RENDERED.move_to_end(key)
            return found
    tokens = tuple(map(int, render()))
    with _RENDERED_LOCK:
        _RENDERED[key] = tokens
        _RENDERED.move_to_end(key)
        if len(_RENDERED) > _RENDERED_MAX:
            _RENDERED.popitem(last=False)
    return tokens


def _special_ids(encoding: HarmonyEncoding, token: str) -> list[int]:
    """The id of a special token, as a one-element list. ``disallowed_special=()``: with
    openai-harmony's default ("all others"), every ``encode`` call compiles a regex over the
    ~3,000 special tokens (1.3 ms; a forced tool choice made five such calls per request)."""
    return [int(t) for t in encoding.encode(token, allowed_special={token}, disallowed_special=())]


def _required_prefill(encoding: HarmonyEncoding) -> Prefill:
    """``<|channel|>commentary to=functions.``: some tool must be called; the model names it."""
    ids = _special_ids(encoding, "<|channel|>")
    ids.extend(int(t) for t in encoding.encode("commentary to=functions.", disallowed_special=()))
    return Prefill(
        channel="commentary",
        recipient="functions.",
        content_type="",
        text="<|channel|>commentary to=functions.",
        token_ids=tuple(ids),
        tool=None,
    )


def _prefill(encoding: HarmonyEncoding, tool: OfferedTool) -> Prefill:
    """``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>`` as token ids.

    The tool name is encoded as plain text, so a name that looks like a special token stays text.
    """
    recipient = tool.recipient
    pieces = [
        ("<|channel|>", True),
        (f"commentary to={recipient} ", False),
        ("<|constrain|>", True),
        ("json", False),
        ("<|message|>", True),
    ]
    ids: list[int] = []
    for piece, special in pieces:
        if special:
            ids.extend(_special_ids(encoding, piece))
        else:
            ids.extend(int(t) for t in encoding.encode(piece, disallowed_special=()))
    text = "".join(piece for piece, _ in pieces)
    return Prefill(
        channel="commentary",
        recipient=recipient,
        content_type=_JSON_CONSTRAINT,
        text=text,
        token_ids=tuple(ids),
        tool=tool,
    )
