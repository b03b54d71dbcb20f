"""Structured outputs on the request path: the turn grammar for an engine that can enforce it.

:func:`grammar_for` is called once per request, after the prompt is rendered. When the request
constrains the model (``text.format`` json_schema / json_object, ``strict`` function tools,
grammar custom tools: see :mod:`domain.constraints`) and the engine enforces grammars
(``engine.constrains``: the vLLM engine with a tokenizer), it returns the llguidance grammar the
engine decodes under. Every constrained piece is compiled first, on its own, so that one that
cannot compile is a 400 before generation naming its parameter (``tools[2].format.definition``,
``text.format.schema``), with llguidance's message; compiled pieces are remembered (Codex sends
the same ``apply_patch`` grammar every turn).

A custom tool whose grammar syntax is neither ``lark`` nor ``regex`` is refused at the edge, whatever
the engine (``app.contract``, ``tools[i].format.syntax``). Engines that cannot enforce (echo, scripted) get no grammar:
the format and the tools' schemas still reach the model in the prompt, as gpt-oss was trained,
and the README says so.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from app.contract import GRAMMAR_SYNTAXES
from app.errors import APIError
from domain.constraints import Piece, turn_grammar
from domain.prompt import RenderedPrompt

__all__ = ["compile_error", "grammar_for"]

_SYNTAXES = GRAMMAR_SYNTAXES


@functools.lru_cache(maxsize=512)
def _compile_error(kind: str, body: str) -> str | None:
    from llguidance import LLMatcher

    from domain.constraints import regex_terminal

    if kind == "json":
        grammar = LLMatcher.grammar_from_lark(f"start: %json {body}\n")
    elif kind == "regex":
        grammar = LLMatcher.grammar_from_lark(f"start: {regex_terminal(body)}\n")
    elif kind == "lark":
        grammar = LLMatcher.grammar_from_lark(f"start: nested\nnested: %lark {{\n{body}\n}}\n")
    else:
        grammar = LLMatcher.grammar_from_lark(body)
    error = LLMatcher.validate_grammar(grammar, None)
    return error.strip() or None


def compile_error(piece: Piece) -> str | None:
    """llguidance's message when ``piece`` cannot compile, else None."""
    return _compile_error(piece.kind, piece.body)


def _what(piece: Piece) -> str:
    if piece.param.startswith("text.format"):
        return "The text.format schema"
    kind = "grammar" if piece.kind in _SYNTAXES else "parameters schema"
    tool = piece.param.removesuffix(".format.definition").removesuffix(".parameters")
    return f"The {kind} of the tool at {tool}"


def grammar_for(
    text_format: Mapping[str, Any] | None, rendered: RenderedPrompt, constrains: bool
) -> str | None:
    """The grammar for this request's turn, or None (nothing constrained, or an engine that
    cannot enforce); raises a 400 :class:`APIError` for a piece that does not compile."""
    if not constrains:
        return None
    turn = turn_grammar(text_format, rendered.tools, rendered.tool_choice, rendered.prefill)
    if turn is None:
        return None
    for piece in turn.pieces:
        error = compile_error(piece)
        if error is not None:
            raise APIError(
                400,
                f"{_what(piece)} cannot be enforced: {error.splitlines()[0]}",
                param=piece.param,
                code="invalid_grammar" if piece.kind in _SYNTAXES else "invalid_json_schema",
            )
    error = _compile_error("turn", turn.grammar)
    if error is not None:  # each piece compiles; together they must too
        raise APIError(
            400,
            f"The request's formats and tools cannot be enforced together: {error.splitlines()[0]}",
            param="tools",
            code="invalid_grammar",
        )
    return turn.grammar
