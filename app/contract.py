"""The request contract: what the server does with every parameter of ``POST /v1/responses``.

:data:`PARAMETERS` is one table of every field of the OpenAI SDK's ``ResponseCreateParams`` (and
the few fields outside it that clients send and the server takes), each **honoured** (it does what
OpenAI documents), a **hint** (accepted, and documented as changing nothing or less than on OpenAI)
or **refused** (a 400 naming it and saying why, whenever it is set to anything but ``null``).
The README's "Request parameters" section is :func:`markdown_table` (a test keeps them equal and
fails when an SDK field is missing from either).

:func:`check_request` is called on the parsed body before the wire model reads it, so what the
server cannot honour is refused at the edge, before anything is rendered or stored:

- a top-level parameter not in the table: 400 ``unknown_parameter``, as OpenAI answers it;
- a refused parameter, a hosted tool type (``web_search``, ``mcp``, ...: the server runs none, so
  a model offered one could never get an answer) or an unknown one, an ``include`` value the
  server cannot deliver, a ``text.format`` of the wrong shape, a ``service_tier`` or
  ``text.verbosity`` OpenAI does not know: 400 naming the parameter path.

A value of the wrong JSON type is left to the wire model (``app.wire``), which names it too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from app.errors import APIError, unknown_parameter

__all__ = [
    "EFFORTS",
    "HOSTED_TOOL_TYPES",
    "INCLUDES",
    "PARAMETERS",
    "RESPONSE_FIELDS",
    "SERVICE_TIERS",
    "SUPPORTED_TOOL_TYPES",
    "UNSET_FIELDS",
    "Parameter",
    "check_request",
    "markdown_table",
]

Handling = Literal["honoured", "hint", "refused"]


@dataclass(frozen=True)
class Parameter:
    name: str
    handling: Handling
    #: What the server does with it (a refused one: why), as the README prints it.
    note: str
    #: Whether it is a field of the SDK's ``ResponseCreateParams`` (else an extension clients send).
    sdk: bool = True


#: Tool types the server offers to the model (``domain.prompt`` renders them); every other is a 400.
SUPPORTED_TOOL_TYPES = ("function", "custom", "namespace")
#: Tool types OpenAI runs itself (hosted or built-in tools): none of them runs here.
HOSTED_TOOL_TYPES = frozenset(
    {
        "web_search",
        "web_search_2025_08_26",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "file_search",
        "code_interpreter",
        "mcp",
        "image_generation",
        "computer",
        "computer_use_preview",
        "local_shell",
        "shell",
        "apply_patch",
        "tool_search",
        "programmatic_tool_calling",
    }
)
#: ``include`` values: None when honoured, else why it is refused.
INCLUDES: Mapping[str, str | None] = {
    "reasoning.encrypted_content": None,
    "message.output_text.logprobs": None,
    "message.input_image.image_url": None,  # input items are stored and listed as sent
    "file_search_call.results": "file_search is a hosted tool this server does not run",
    "web_search_call.results": "web_search is a hosted tool this server does not run",
    "web_search_call.action.sources": "web_search is a hosted tool this server does not run",
    "code_interpreter_call.outputs": "code_interpreter is a hosted tool this server does not run",
    "computer_call_output.output.image_url": "computer use is a hosted tool this server does not run",
}
#: Every ``reasoning.effort`` of the SDK, and the Harmony ``Reasoning:`` level it renders as
#: (``domain.prompt``): gpt-oss has three levels and cannot switch reasoning off.
EFFORTS: Mapping[str, str] = {
    "none": "low",
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "high",
}
#: OpenAI's ``service_tier`` values (the SDK's ``ServiceTier``); the server has one tier.
SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority", "fast", "ultrafast")
_VERBOSITIES = ("low", "medium", "high")
_FORMAT_TYPES = ("text", "json_schema", "json_object")
#: The syntaxes of a custom tool's grammar format.
GRAMMAR_SYNTAXES = ("lark", "regex")
_FORMAT_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")

_NOT_SAMPLED = "the echo and scripted engines do not sample and ignore it"

PARAMETERS: tuple[Parameter, ...] = (
    Parameter(
        "access_programs",
        "refused",
        "OpenAI's account access programs (Cyber tiers) do not exist on this server.",
    ),
    Parameter("background", "honoured", "Generated in the background; poll, stream or cancel it."),
    Parameter(
        "background_options",
        "hint",
        '`completion_window: "soonest"` and `continuation_id` are accepted and change nothing; '
        "the discounted `2h` / `8h` windows are refused (there is no deferred execution).",
    ),
    Parameter(
        "context_management",
        "honoured",
        '`[{"type": "compaction", "compact_threshold": N}]`: a prompt of more than N tokens is '
        "compacted first (the model summarises it; the first output item is the `compaction` "
        "item) and the answer is generated from the compacted context; N null is 80 % of the "
        "context window.",
    ),
    Parameter(
        "conversation",
        "honoured",
        'A conversation id or `{"id": ...}` (`/v1/conversations`): its items are the history, '
        "and the response's input and output items are appended when it ends `completed` or "
        "`incomplete`; with `previous_response_id` it is a 400.",
    ),
    Parameter(
        "image", "hint", "Image options; gpt-oss reads text only (images become placeholders)."
    ),
    Parameter(
        "include",
        "honoured",
        "`reasoning.encrypted_content`, `message.output_text.logprobs` (vLLM engine; the echo and "
        "scripted engines have none: a 400) and "
        "`message.input_image.image_url` (input items are listed as sent); the hosted-tool values "
        "(`file_search_call.results`, `web_search_call.*`, `code_interpreter_call.outputs`, "
        "`computer_call_output.output.image_url`) and unknown ones are a 400.",
    ),
    Parameter("input", "honoured", "Rendered into the Harmony prompt."),
    Parameter("instructions", "honoured", "The developer message's `# Instructions`."),
    Parameter(
        "max_output_tokens", "honoured", "The engine's token limit; `incomplete` when reached."
    ),
    Parameter(
        "max_tool_calls",
        "hint",
        "Echoed; it limits built-in tools on OpenAI, and none run here "
        "(a response ends at its first function call).",
    ),
    Parameter("metadata", "honoured", "Stored and echoed (16 keys, 64/512 characters)."),
    Parameter("model", "honoured", "A served model name or alias; 404 otherwise."),
    Parameter("moderation", "refused", "No moderation model runs on this server."),
    Parameter(
        "parallel_tool_calls",
        "hint",
        "Echoed; gpt-oss writes one call per turn (generation stops at `<|call|>`), "
        "so a response holds at most one call either way.",
    ),
    Parameter(
        "previous_response_id",
        "honoured",
        "The chain's logs are replayed into the prompt; a response still generating gives its "
        "input and the output items it has finished.",
    ),
    Parameter(
        "prompt",
        "refused",
        "Prompt templates live in OpenAI's dashboard; send `instructions` and `input` instead.",
    ),
    Parameter(
        "prompt_cache_key",
        "hint",
        "Stored and echoed; the engine's prefix cache is automatic and needs no key.",
    ),
    Parameter(
        "prompt_cache_options", "hint", "Accepted; the engine's prefix cache has no breakpoints."
    ),
    Parameter(
        "prompt_cache_retention", "hint", "Echoed; the engine's prefix cache lives in its memory."
    ),
    Parameter(
        "reasoning",
        "honoured",
        "`effort`: every SDK value maps to a Harmony level (none, minimal, low -> low; medium; "
        "high, xhigh, max -> high); `summary`, `generate_summary`, `context`, `mode`: hints "
        "(reasoning is returned as `reasoning_text`, no summaries are written).",
    ),
    Parameter("safety_identifier", "hint", "Stored and echoed."),
    Parameter(
        "service_tier",
        "hint",
        "Echoed (`default` when absent); one tier serves every request. "
        "Values OpenAI does not know are a 400.",
    ),
    Parameter(
        "store", "honoured", "`false`: the response lives in memory only and is never written."
    ),
    Parameter("stream", "honoured", "Server-sent events, each one an event of the log."),
    Parameter(
        "stream_options", "hint", "`include_obfuscation`: no obfuscation field is ever added."
    ),
    Parameter("temperature", "honoured", f"Passed to vLLM; {_NOT_SAMPLED}."),
    Parameter(
        "text",
        "honoured",
        "`format`: `text`, `json_schema` (`name`, `schema`, optional `strict`) or `json_object`, "
        "else a 400; a JSON format is shown in the prompt's Response Formats and enforced on "
        "vLLM (the final answer is held to it; the echo and scripted engines cannot enforce); "
        "a schema that cannot compile is a 400; `verbosity` (low, medium, high): a hint, echoed.",
    ),
    Parameter(
        "tool_choice", "honoured", "`auto`, `none`, `required`, a named or an allowed-tools choice."
    ),
    Parameter(
        "tools",
        "honoured",
        "`function`, `custom` and `namespace` tools are offered to the model; on vLLM a `strict` "
        "function's arguments (strict unless `false`) are held to its schema and a custom tool's "
        "Lark or regex grammar to its payload (another syntax, or one that cannot compile, is a "
        "400); hosted tool types "
        "(web_search, file_search, code_interpreter, mcp, image_generation, computer_use_preview, "
        "local_shell, shell, apply_patch, tool_search, ...) and unknown ones are a 400 naming "
        "`tools[i].type`.",
    ),
    Parameter(
        "top_logprobs",
        "honoured",
        'With `include: ["message.output_text.logprobs"]`, vLLM\'s logprobs on output text.',
    ),
    Parameter("top_p", "honoured", f"Passed to vLLM; {_NOT_SAMPLED}."),
    Parameter(
        "truncation",
        "honoured",
        "`auto` drops the oldest conversation items until the prompt and `max_output_tokens` "
        "fit; `disabled` (the default) answers 400 `context_length_exceeded`.",
    ),
    Parameter("user", "hint", "Stored and echoed (OpenAI replaces it with `safety_identifier`)."),
    # not in the SDK's ResponseCreateParams, but sent by clients and taken here
    Parameter(
        "presence_penalty",
        "honoured",
        f"-2 to 2, passed to vLLM and echoed (0 by default); {_NOT_SAMPLED}.",
        sdk=False,
    ),
    Parameter(
        "frequency_penalty",
        "honoured",
        f"-2 to 2, passed to vLLM and echoed (0 by default); {_NOT_SAMPLED}.",
        sdk=False,
    ),
    Parameter("seed", "honoured", f"vLLM's sampling seed (64-bit); {_NOT_SAMPLED}.", sdk=False),
    Parameter("client_metadata", "hint", "Sent by the Codex CLI; accepted and ignored.", sdk=False),
)

_BY_NAME = {p.name: p for p in PARAMETERS}

#: Every field of OpenAI's ``Response`` object (the SDK 3.57 model). Every Response the server
#: returns carries each of them, from ``response.created`` on: null until it is known (like
#: ``completed_at``), or for good where the server has nothing to say (``prompt``,
#: ``tool_usage``, ...; ``conversation`` when none is named).
RESPONSE_FIELDS = (
    "id",
    "access_programs",
    "created_at",
    "error",
    "incomplete_details",
    "instructions",
    "metadata",
    "model",
    "object",
    "output",
    "parallel_tool_calls",
    "temperature",
    "tool_choice",
    "tools",
    "top_p",
    "background",
    "completed_at",
    "conversation",
    "image",
    "input_transformations",
    "max_output_tokens",
    "max_tool_calls",
    "moderation",
    "previous_response_id",
    "prompt",
    "prompt_cache_diagnostics",
    "prompt_cache_key",
    "prompt_cache_options",
    "prompt_cache_retention",
    "reasoning",
    "safety_identifier",
    "service_tier",
    "status",
    "text",
    "tool_usage",
    "top_logprobs",
    "truncation",
    "usage",
    "user",
)
#: The skeleton of a Response: every field, null.
UNSET_FIELDS: Mapping[str, None] = dict.fromkeys(RESPONSE_FIELDS)


def markdown_table() -> str:
    """The README's table of :data:`PARAMETERS`."""
    rows = ["| Parameter | Handling | What the server does |", "|---|---|---|"]
    for p in PARAMETERS:
        name = f"`{p.name}`" if p.sdk else f"`{p.name}` (not in the SDK)"
        rows.append(f"| {name} | {p.handling} | {p.note} |")
    return "\n".join(rows)


def check_request(body: Mapping[str, Any]) -> None:
    """Refuse (:class:`APIError` 400) what the server cannot honour in ``body`` (see the module
    docstring); values of the wrong JSON type are left to the wire model."""
    for name, value in body.items():
        parameter = _BY_NAME.get(name)
        if parameter is None:
            raise unknown_parameter(name)
        if value is None:
            continue
        if parameter.handling == "refused":
            raise _invalid(
                name,
                f"'{name}' is not supported by this server: {parameter.note}",
                "unsupported_parameter",
            )
        check = _CHECKS.get(name)
        if check is not None:
            check(value)


def _invalid(param: str, message: str, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def _check_tools(tools: Any) -> None:
    if not isinstance(tools, list):
        return
    supported = ", ".join(SUPPORTED_TOOL_TYPES)
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            continue  # the wire model names it
        _check_tool(tool, f"tools[{i}]", supported)
        members = tool.get("tools")
        if tool["type"] == "namespace" and isinstance(members, list):
            for j, member in enumerate(members):
                if isinstance(member, dict) and isinstance(member.get("type"), str):
                    if member["type"] == "namespace":
                        raise _invalid(
                            f"tools[{i}].tools[{j}].type",
                            "A namespace cannot hold another namespace.",
                        )
                    _check_tool(member, f"tools[{i}].tools[{j}]", supported)


def _check_tool(tool: dict[str, Any], param: str, supported: str) -> None:
    kind = tool["type"]
    if kind == "custom":
        _check_custom_format(tool, param)
    if kind in SUPPORTED_TOOL_TYPES:
        return
    if kind in HOSTED_TOOL_TYPES:
        message = (
            f"Tool type '{kind}' is a hosted tool, which this server does not run (the model "
            f"could never get its result); supported tool types: {supported}."
        )
        if kind.startswith("web_search"):
            message += ' (Codex CLI: set web_search = "disabled" in config.toml.)'
    else:
        message = f"Unknown tool type '{kind}'; supported tool types: {supported}."
    raise _invalid(
        f"{param}.type",
        message,
        "unsupported_value" if kind in HOSTED_TOOL_TYPES else "invalid_value",
    )


def _check_include(include: Any) -> None:
    if not isinstance(include, list):
        return
    for i, value in enumerate(include):
        if not isinstance(value, str):
            continue  # the wire model names it
        if value not in INCLUDES:
            known = ", ".join(INCLUDES)
            raise _invalid(
                f"include[{i}]", f"Unknown include value '{value}'; OpenAI's values are: {known}."
            )
        why = INCLUDES[value]
        if why is not None:
            raise _invalid(
                f"include[{i}]", f"include '{value}' is not supported: {why}.", "unsupported_value"
            )


def _check_text(text: Any) -> None:
    if not isinstance(text, dict):
        return
    verbosity = text.get("verbosity")
    if verbosity is not None and verbosity not in _VERBOSITIES:
        raise _invalid(
            "text.verbosity",
            f"Invalid value for 'text.verbosity': expected one of {_choices(_VERBOSITIES)}.",
        )
    fmt = text.get("format")
    if fmt is None:
        return
    if not isinstance(fmt, dict):
        raise _invalid(
            "text.format", "Invalid value for 'text.format': expected an object.", "invalid_type"
        )
    kind = fmt.get("type")
    if kind not in _FORMAT_TYPES:
        raise _invalid(
            "text.format.type",
            f"Invalid value for 'text.format.type': {kind!r}; expected one of {_choices(_FORMAT_TYPES)}.",
        )
    if kind != "json_schema":
        return
    name = fmt.get("name")
    if name is None:
        raise APIError(
            400,
            "Missing required parameter: 'text.format.name'.",
            param="text.format.name",
            code="missing_required_parameter",
        )
    if not isinstance(name, str) or _FORMAT_NAME.fullmatch(name) is None:
        raise _invalid(
            "text.format.name",
            "Invalid value for 'text.format.name': 1 to 64 characters of a-z, A-Z, 0-9, '_' and '-'.",
        )
    schema = fmt.get("schema")
    if schema is None:
        raise APIError(
            400,
            "Missing required parameter: 'text.format.schema'.",
            param="text.format.schema",
            code="missing_required_parameter",
        )
    if not isinstance(schema, dict):
        raise _invalid(
            "text.format.schema",
            "Invalid value for 'text.format.schema': expected a JSON schema object.",
            "invalid_type",
        )
    strict = fmt.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise _invalid(
            "text.format.strict",
            "Invalid value for 'text.format.strict': expected a boolean.",
            "invalid_type",
        )
    description = fmt.get("description")
    if description is not None and not isinstance(description, str):
        raise _invalid(
            "text.format.description",
            "Invalid value for 'text.format.description': expected a string.",
            "invalid_type",
        )


def _check_custom_format(tool: dict[str, Any], param: str) -> None:
    """A grammar format in a syntax a backend reads (``lark``, ``regex``) with a definition, on
    every engine: ``app.constraints`` compiles it where the engine enforces it."""
    fmt = tool.get("format")
    if not isinstance(fmt, dict) or fmt.get("type") != "grammar":
        return
    if fmt.get("syntax") not in GRAMMAR_SYNTAXES:
        raise _invalid(
            f"{param}.format.syntax",
            f"Custom tool {tool.get('name')!r}: grammar syntax {fmt.get('syntax')!r} is not "
            "supported; use 'lark' or 'regex'.",
        )
    definition = fmt.get("definition")
    if not isinstance(definition, str) or not definition.strip():
        raise _invalid(
            f"{param}.format.definition",
            f"Custom tool {tool.get('name')!r}: a grammar format needs a 'definition' string.",
        )


def _check_service_tier(tier: Any) -> None:
    if tier not in SERVICE_TIERS:
        raise _invalid(
            "service_tier",
            f"Invalid value for 'service_tier': expected one of {_choices(SERVICE_TIERS)}.",
        )


def _check_background_options(options: Any) -> None:
    if not isinstance(options, dict):
        raise _invalid(
            "background_options",
            "Invalid value for 'background_options': expected an object.",
            "invalid_type",
        )
    window = options.get("completion_window")
    if window in ("2h", "8h"):
        raise _invalid(
            "background_options.completion_window",
            f"completion_window '{window}' is not supported: this server has no deferred, discounted "
            "execution; every response is generated as soon as possible ('soonest').",
            "unsupported_value",
        )
    if window is not None and window != "soonest":
        raise _invalid(
            "background_options.completion_window",
            "Invalid value for 'background_options.completion_window': expected one of 'soonest', '2h', '8h'.",
        )


def _choices(values: Any) -> str:
    return ", ".join(f"'{v}'" for v in values)


def _check_context_management(value: Any) -> None:
    """``context_management``: a list of ``{"type": "compaction", "compact_threshold": N}``
    (at most one; N a positive integer, or null for 80 % of the engine's context window)."""
    if not isinstance(value, list):
        raise _invalid("context_management", "'context_management' must be an array.")
    if len(value) > 1:
        raise _invalid("context_management", "'context_management' takes one compaction entry.")
    for index, entry in enumerate(value):
        param = f"context_management[{index}]"
        if not isinstance(entry, dict):
            raise _invalid(param, f"'{param}' must be an object.")
        for key in entry:
            if key not in ("type", "compact_threshold"):
                raise _invalid(
                    f"{param}.{key}", f"Unknown parameter: '{param}.{key}'.", "unknown_parameter"
                )
        if entry.get("type") != "compaction":
            raise _invalid(
                f"{param}.type", "Only context management of type 'compaction' is supported."
            )
        threshold = entry.get("compact_threshold")
        if threshold is not None and (
            isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1
        ):
            raise _invalid(
                f"{param}.compact_threshold", "'compact_threshold' must be a positive integer."
            )


_CHECKS: Mapping[str, Callable[[Any], None]] = {
    "tools": _check_tools,
    "include": _check_include,
    "text": _check_text,
    "service_tier": _check_service_tier,
    "background_options": _check_background_options,
    "context_management": _check_context_management,
}
