"""What the model may write, as one grammar over the whole Harmony turn (structured outputs).

A request constrains the model when its ``text.format`` is ``json_schema`` or ``json_object``,
when it offers a ``strict`` function tool (``strict`` is true unless the tool says false, as in
OpenAI's API), or a custom tool whose ``format`` is a Lark or regex grammar. Then
:func:`turn_grammar` writes an llguidance Lark grammar for everything the model generates after
``<|start|>assistant`` (or after a forced tool choice's prefill), Harmony's special tokens
included, and the engine decodes under it (vLLM's structured outputs, ``guidance`` backend):

- at most one ``analysis`` message, then (when tools are offered) at most one ``commentary``
  preamble, each free text, each ended by ``<|end|>`` and followed by ``<|start|>assistant``;
- then the turn's end: the ``final`` message, whose text is the JSON schema's (or any JSON object)
  when ``text.format`` asks for one and free text otherwise, ended by ``<|return|>``; or a call
  ``<|channel|>commentary to=functions.NAME``: a strict function's arguments are its JSON schema
  (``<|constrain|>json``), a non-strict function's are free text (``<|constrain|>json``), a grammar
  custom tool's raw payload is its grammar (no JSON envelope: ``domain.custom_tools`` takes bare
  text verbatim), ended by ``<|call|>``. ``tool_choice`` ``none`` leaves only the final message,
  ``required`` only calls.

Free text is any sequence of ordinary tokens: no special token can appear inside it, so reasoning,
preambles and unconstrained answers are exactly as free as without a grammar, and the structure
around them is Harmony's. Reasoning stays free; only the final answer and the calls are bound.

The grammar is text; compiling it (and refusing what cannot compile, naming the parameter) is the
engine side's (:mod:`app.constraints`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from domain.prompt import OfferedTool, Prefill, ToolChoice

__all__ = ["Piece", "TurnGrammar", "grammar_pieces", "regex_terminal", "turn_grammar"]

_TEXT = "TEXT: /(?s:.*)/"
#: JSON written compactly: whitespace between tokens is not the model's to choose (random or
#: confused weights would otherwise fill the context with it).
_COMPACT = {"whitespace_flexible": False}


@dataclass(frozen=True)
class Piece:
    """One constrained part: the request parameter it comes from and its grammar body."""

    param: str
    #: ``json`` (``body`` is a JSON schema), ``lark`` or ``regex`` (``body`` is the definition).
    kind: str
    body: str


@dataclass(frozen=True)
class TurnGrammar:
    grammar: str
    #: What is constrained, each piece on its own (for compiling them one by one, naming the
    #: parameter of one that does not compile).
    pieces: tuple[Piece, ...]


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def regex_terminal(pattern: str) -> str:
    """A regex custom tool's definition as a Lark terminal: the whole payload matches, so ``^``
    and ``$`` at the ends are dropped; ``/`` is escaped for the terminal's delimiters."""
    body = pattern
    if body.startswith("^"):
        body = body[1:]
    if body.endswith("$") and not body.endswith("\\$"):
        body = body[:-1]
    return "/" + body.replace("\\/", "/").replace("/", "\\/") + "/"


def _schema_body(schema: Mapping[str, object]) -> str:
    return json.dumps({**schema, "x-guidance": _COMPACT}, ensure_ascii=False)


def grammar_pieces(
    text_format: Mapping[str, object] | None, tools: tuple[OfferedTool, ...]
) -> tuple[Piece, ...]:
    """The constrained parts of a request: its format, then its tools in order."""
    pieces: list[Piece] = []
    kind = text_format.get("type") if text_format else None
    if kind == "json_schema" and text_format is not None:
        schema = text_format.get("schema")
        pieces.append(
            Piece(
                "text.format.schema",
                "json",
                _schema_body(schema if isinstance(schema, Mapping) else {}),
            )
        )
    elif kind == "json_object":
        pieces.append(Piece("text.format", "json", _schema_body({"type": "object"})))
    for tool in tools:
        param = tool.param
        if tool.type == "function" and tool.strict:
            schema = (
                tool.parameters
                if tool.parameters is not None
                else {"type": "object", "properties": {}}
            )
            pieces.append(Piece(f"{param}.parameters", "json", _schema_body(schema)))
        elif tool.type == "custom" and tool.grammar is not None:
            syntax, definition = tool.grammar
            pieces.append(Piece(f"{param}.format.definition", syntax, definition))
    return tuple(pieces)


def _body_rule(name: str, piece: Piece | None) -> str:
    if piece is None:
        return f"{name}: TEXT"
    if piece.kind == "json":
        return f"{name}: %json {piece.body}"
    if piece.kind == "regex":
        return f"{name}: %lark {{\nstart: {regex_terminal(piece.body)}\n}}"
    return f"{name}: %lark {{\n{piece.body}\n}}"


def turn_grammar(
    text_format: Mapping[str, object] | None,
    tools: tuple[OfferedTool, ...],
    choice: ToolChoice,
    prefill: Prefill | None,
) -> TurnGrammar | None:
    """The grammar of the turn (see the module docstring), or None when nothing is constrained."""
    pieces = grammar_pieces(text_format, tools)
    if not pieces:
        return None
    by_param = {p.param: p for p in pieces}
    fmt_piece = by_param.get("text.format.schema") or by_param.get("text.format")
    rules = [_TEXT, _body_rule("final_body", fmt_piece)]
    calls: list[str] = []
    for index, tool in enumerate(tools):
        param = tool.param
        piece = by_param.get(f"{param}.parameters") or by_param.get(f"{param}.format.definition")
        raw = tool.type == "custom" and tool.grammar is not None
        header = "" if raw else ' " " <|constrain|> "json"'
        rules.append(_body_rule(f"args_{index}", piece))
        calls.append(f"call_{index}")
        if prefill is not None and prefill.tool is not None:
            continue  # the named call's header is in the prompt
        name = (
            tool.model_name if prefill is not None else f"commentary to=functions.{tool.model_name}"
        )
        opener = "" if prefill is not None else "<|channel|> "
        rules.append(
            f"call_{index}: {opener}{_literal(name)}{header} <|message|> args_{index} <|call|>"
        )
    if prefill is not None and prefill.tool is not None:
        index = next(i for i, t in enumerate(tools) if t.model_name == prefill.tool.model_name)
        start = f"start: args_{index} <|call|>"
    elif prefill is not None:  # required: the prompt ends with "to=functions."
        start = "start: " + " | ".join(calls)
    else:
        rules.append(
            'analysis: <|channel|> "analysis" <|message|> TEXT <|end|> <|start|> "assistant"'
        )
        rules.append('final: <|channel|> "final" <|message|> final_body <|return|>')
        ends = ["final"] if choice.mode != "required" else []
        ends.extend(calls if choice.mode != "none" else [])
        head = "analysis?"
        if tools and choice.mode != "none":
            rules.append(
                'preamble: <|channel|> "commentary" <|message|> TEXT <|end|> <|start|> "assistant"'
            )
            head += " preamble?"
        start = f"start: {head} ({' | '.join(ends)})"
    return TurnGrammar("\n".join([start, *rules]) + "\n", pieces)
