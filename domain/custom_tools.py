"""Custom tools, offered to gpt-oss as functions that take one string.

A Responses API custom tool (``{"type": "custom", "name", "description", "format"}``) takes free
text, optionally described by a grammar (``format: {"type": "grammar", "syntax": "lark" | "regex",
"definition": ...}``). Harmony only knows function calls, so a custom tool is shown to the model as
a function in the ``functions`` namespace whose one parameter is ``{"input": string}`` and whose
description carries the format. A tool with a Lark or regex grammar (:func:`custom_grammar`) is
told to write its input *raw*, as the call's message, and on an engine that constrains the
payload is held to the grammar (:mod:`domain.constraints`); its past calls are replayed raw too.

Going back, the call's JSON arguments are unwrapped to the text. The model does not always follow
the schema, so the unwrapping is tolerant, and it is defined by one incremental machine,
:class:`CustomInputStream`, so that the streamed ``custom_tool_call_input`` deltas and the final
``input`` can never disagree (:func:`decode_custom_input` is that machine fed in one piece):

- Arguments that (after JSON whitespace) open an object whose first member has a string value
  decode to that string, whatever the member's name (``"input"`` normally; a model that picked
  another key still gets its text through). JSON escapes are undone, ``\\uXXXX`` surrogate pairs
  included, exactly as ``json.loads`` would for valid JSON. What follows the string is ignored.
- Anything else -- bare text, an object whose first value is not a string, ``{}``, text cut off
  before the string started -- is taken verbatim as the input.
- Leniency where JSON would fail: an unknown escape ``\\q`` is kept as the two characters, a broken
  ``\\u`` escape is kept as written, a lone surrogate escape becomes the lone surrogate (as in
  ``json.loads``), and a string cut off by the end of generation yields what was decoded so far.

The first member wins even when a later member is named ``"input"``: deciding otherwise would
mean holding back every delta until the object closes.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping

from domain.errors import InvalidInput

__all__ = [
    "INPUT_KEY",
    "CustomInputStream",
    "custom_grammar",
    "custom_tool_as_function",
    "decode_custom_input",
    "encode_custom_input",
]

#: The one property of the function a custom tool is shown as.
INPUT_KEY = "input"

_WHITESPACE = frozenset(" \t\n\r")
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
_SIMPLE_ESCAPES = {
    '"': '"',
    "\\": "\\",
    "/": "/",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
}
_PLAIN_RUN = re.compile(r'[^"\\]+')

_SCHEMA: dict[str, object] = {
    "type": "object",
    "properties": {
        INPUT_KEY: {"type": "string", "description": "The tool's entire input, as one string."}
    },
    "required": [INPUT_KEY],
    "additionalProperties": False,
}


def custom_tool_as_function(
    tool: Mapping[str, object], *, param: str = "tool"
) -> tuple[str, str, dict[str, object]]:
    """``(name, description, parameters JSON schema)`` of the function that stands for ``tool``.

    ``param`` prefixes the ``param`` of the :class:`~domain.errors.InvalidInput` raised for a tool
    without a name (e.g. ``"tools[2]"``). An unknown ``format`` never fails: it is described as
    well as it can be.
    """
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidInput(
            "A custom tool needs a non-empty name",
            param=f"{param}.name",
            code="missing_required_parameter",
        )
    description = tool.get("description")
    lines = [description.strip()] if isinstance(description, str) and description.strip() else []
    if custom_grammar(tool) is not None:
        lines.append("Write the input itself as the message of the call, not wrapped in JSON.")
    else:
        lines.append(
            f'Call it with a JSON object {{"{INPUT_KEY}": "..."}} whose "{INPUT_KEY}" string is the '
            "whole input."
        )
    lines.extend(_format_lines(tool.get("format")))
    schema = json.loads(json.dumps(_SCHEMA))  # a fresh copy the caller may keep or change
    return name, "\n".join(lines), schema


def custom_grammar(tool: Mapping[str, object]) -> tuple[str, str] | None:
    """``(syntax, definition)`` of a custom tool whose ``format`` is a Lark or regex grammar: its
    payload is written raw and held to the grammar (:mod:`domain.constraints`); else None."""
    fmt = tool.get("format")
    if not isinstance(fmt, Mapping) or fmt.get("type") != "grammar":
        return None
    syntax, definition = fmt.get("syntax"), fmt.get("definition")
    if syntax in ("lark", "regex") and isinstance(definition, str):
        return str(syntax), definition
    return None


def _format_lines(fmt: object) -> list[str]:
    if fmt is None:
        return ["The input is free-form text."]
    if not isinstance(fmt, Mapping):
        return [f"The input must follow this format: {json.dumps(fmt, ensure_ascii=False)}"]
    kind = fmt.get("type")
    if kind == "text":
        return ["The input is free-form text."]
    definition = fmt.get("definition")
    syntax = fmt.get("syntax")
    if kind == "grammar" and isinstance(definition, str):
        if syntax == "regex":
            return [f"The input must match this regular expression:\n{definition}"]
        label = "Lark" if syntax == "lark" else str(syntax)
        fence = syntax if isinstance(syntax, str) else ""
        return [f"The input must follow this {label} grammar:\n```{fence}\n{definition}\n```"]
    return [f"The input must follow this format: {json.dumps(dict(fmt), ensure_ascii=False)}"]


def encode_custom_input(text: str) -> str:
    """The function-call arguments that carry ``text``: ``{"input": text}`` as compact JSON.

    Non-ASCII characters stay as they are (the model writes them that way too).
    """
    return json.dumps({INPUT_KEY: text}, ensure_ascii=False, separators=(",", ":"))


def decode_custom_input(arguments: str) -> str:
    """The custom tool input carried by ``arguments`` (see the module docstring for the rules)."""
    stream = CustomInputStream()
    return stream.feed(arguments) + stream.finish()


class _State(enum.Enum):
    # Before the string value starts; the raw text is kept in case it is not JSON after all.
    LEAD = enum.auto()
    OBJECT = enum.auto()
    KEY = enum.auto()
    KEY_ESCAPE = enum.auto()
    AFTER_KEY = enum.auto()
    BEFORE_VALUE = enum.auto()
    # Inside the string value.
    VALUE = enum.auto()
    ESCAPE = enum.auto()
    UNICODE = enum.auto()
    HIGH = enum.auto()  # a high surrogate escape was read; a low one may follow
    HIGH_ESCAPE = enum.auto()
    HIGH_UNICODE = enum.auto()
    # After the value: the rest is ignored.
    DONE = enum.auto()
    # Not JSON: everything is the input, verbatim.
    BARE = enum.auto()
    FINISHED = enum.auto()


_PRELUDE = frozenset(
    {
        _State.LEAD,
        _State.OBJECT,
        _State.KEY,
        _State.KEY_ESCAPE,
        _State.AFTER_KEY,
        _State.BEFORE_VALUE,
    }
)


class CustomInputStream:
    """Incremental :func:`decode_custom_input`: feed the arguments as they are generated.

    For any split of the arguments into chunks, the concatenation of what :meth:`feed` returns and
    what :meth:`finish` returns equals ``decode_custom_input(arguments)``.
    """

    def __init__(self) -> None:
        self._state = _State.LEAD
        self._raw: list[str] = []
        self._hex = ""
        self._high = 0

    def feed(self, chunk: str) -> str:
        """Consume the next piece of the arguments; return the newly decoded input text."""
        if self._state is _State.FINISHED:
            raise ValueError("CustomInputStream.feed() after finish()")
        out: list[str] = []
        i, n = 0, len(chunk)
        while i < n:
            state = self._state
            if state is _State.BARE:
                out.append(chunk[i:])
                break
            if state is _State.DONE:
                break
            if state is _State.VALUE:
                run = _PLAIN_RUN.match(chunk, i)
                if run is not None:
                    out.append(run.group())
                    i = run.end()
                    continue
            self._step(chunk[i], out)
            i += 1
        return "".join(out)

    def finish(self) -> str:
        """The end of the arguments: return what was held back (nothing, most of the time)."""
        state = self._state
        self._state = _State.FINISHED
        if state in _PRELUDE:
            rest = "".join(self._raw)
        elif state is _State.ESCAPE:
            rest = "\\"
        elif state is _State.UNICODE:
            rest = "\\u" + self._hex
        elif state is _State.HIGH:
            rest = chr(self._high)
        elif state is _State.HIGH_ESCAPE:
            rest = chr(self._high) + "\\"
        elif state is _State.HIGH_UNICODE:
            rest = chr(self._high) + "\\u" + self._hex
        else:
            rest = ""
        self._raw = []
        return rest

    def _to_bare(self, out: list[str]) -> None:
        out.append("".join(self._raw))
        self._raw = []
        self._state = _State.BARE

    def _step(self, c: str, out: list[str]) -> None:
        state = self._state
        if state in _PRELUDE:
            self._raw.append(c)
            if state is _State.KEY:
                if c == "\\":
                    self._state = _State.KEY_ESCAPE
                elif c == '"':
                    self._state = _State.AFTER_KEY
            elif state is _State.KEY_ESCAPE:
                self._state = _State.KEY
            elif c in _WHITESPACE:
                pass
            elif state is _State.LEAD and c == "{":
                self._state = _State.OBJECT
            elif state is _State.OBJECT and c == '"':
                self._state = _State.KEY
            elif state is _State.AFTER_KEY and c == ":":
                self._state = _State.BEFORE_VALUE
            elif state is _State.BEFORE_VALUE and c == '"':
                self._raw = []
                self._state = _State.VALUE
            else:
                self._to_bare(out)
        elif state is _State.VALUE:
            if c == "\\":
                self._state = _State.ESCAPE
            elif c == '"':
                self._state = _State.DONE
            else:
                out.append(c)
        elif state is _State.ESCAPE:
            if c == "u":
                self._hex = ""
                self._state = _State.UNICODE
            else:
                out.append(_SIMPLE_ESCAPES.get(c, "\\" + c))
                self._state = _State.VALUE
        elif state is _State.UNICODE:
            if c in _HEX_DIGITS:
                self._hex += c
                if len(self._hex) == 4:
                    self._code_point(int(self._hex, 16), out)
            else:
                out.append("\\u" + self._hex)
                self._state = _State.VALUE
                self._step(c, out)
        elif state is _State.HIGH:
            if c == "\\":
                self._state = _State.HIGH_ESCAPE
            else:
                out.append(chr(self._high))
                self._state = _State.VALUE
                self._step(c, out)
        elif state is _State.HIGH_ESCAPE:
            if c == "u":
                self._hex = ""
                self._state = _State.HIGH_UNICODE
            else:
                out.append(chr(self._high))
                self._state = _State.ESCAPE
                self._step(c, out)
        elif state is _State.HIGH_UNICODE:
            if c in _HEX_DIGITS:
                self._hex += c
                if len(self._hex) == 4:
                    low = int(self._hex, 16)
                    if 0xDC00 <= low <= 0xDFFF:
                        out.append(chr(0x10000 + ((self._high - 0xD800) << 10) + (low - 0xDC00)))
                        self._state = _State.VALUE
                    else:
                        # Not a pair: the high surrogate stands alone, the second escape is read
                        # afresh (json.loads does the same).
                        out.append(chr(self._high))
                        self._code_point(low, out)
            else:
                out.append(chr(self._high) + "\\u" + self._hex)
                self._state = _State.VALUE
                self._step(c, out)

    def _code_point(self, code: int, out: list[str]) -> None:
        if 0xD800 <= code <= 0xDBFF:
            self._high = code
            self._state = _State.HIGH
        else:
            out.append(chr(code))
            self._state = _State.VALUE
