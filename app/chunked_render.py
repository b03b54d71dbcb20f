"""Rendering a large prompt without holding the GIL for long: long texts are encoded in pieces.

openai-harmony's Rust calls hold the GIL for their whole length (measured: rendering an 8.4 MB
user message takes 0.6 s, and a thread that sleeps 1 ms meanwhile wakes after 0.6 s), so moving
a large render to a worker thread alone would not keep the event loop going. This module's
:class:`ChunkedEncoding` stands in for the encoding during such a render (``domain.prompt`` only
calls methods of it) and renders a message whose one text is long as Harmony does, in short
calls:

- Harmony renders a text message as its header, the text encoded as ordinary text (special
  tokens in it stay text), and the end token: ``render(m) == render(m with "")[:-1] +
  encode(text) + render(m with "")[-1:]`` (held against Harmony in the tests, and checked on a
  probe message before every use, so a Harmony that renders otherwise is noticed, not trusted);
- o200k's pre-tokeniser cuts the text into pieces and encodes each alone, so the text may be
  encoded slice by slice if every cut falls between two pieces. :func:`split_points` cuts only
  where o200k always does: before a space that follows a character that is not whitespace (no
  piece of o200k takes a space after a letter, a digit or a symbol: letter and digit pieces hold
  no space, and a symbol piece may only be followed by line breaks or ``/``), or after a line
  break followed by a character that is neither whitespace nor ``/`` (no piece starts with a
  line break and goes on with such a character). The regex has no lookbehind, so what follows a
  cut is cut the same alone.

A text with no such place (a huge run of one kind of character) is not cut; such runs longer
than :data:`app.tokenizer_limits.MAX_RUN` are refused before rendering anyway.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from openai_harmony import HarmonyEncoding, Message, RenderOptions, TextContent

__all__ = ["SLICE_CHARS", "ChunkedEncoding", "is_panic", "split_points", "text_size_over"]

#: Characters encoded per Harmony call (~4 ms of GIL for ordinary text).
SLICE_CHARS = 1 << 16


def is_panic(exc: BaseException) -> bool:
    """Whether ``exc`` is a Rust panic raised through pyo3 (``pyo3_runtime.PanicException``, a
    ``BaseException``; the class is not importable by name)."""
    return type(exc).__name__ == "PanicException"


def split_points(text: str, every: int = SLICE_CHARS) -> Iterator[int]:
    """Indexes, about ``every`` characters apart, where ``text`` may be cut without changing
    how o200k tokenises it (see the module docstring)."""
    pos = every
    n = len(text)
    while pos < n:
        cut = _cut_at_or_after(text, pos)
        if cut is None:
            return
        yield cut
        pos = cut + every


def _cut_at_or_after(text: str, pos: int) -> int | None:
    n = len(text)
    while pos < n:
        space = text.find(" ", pos)
        newline = text.find("\n", pos)
        candidates = [c for c in (space, newline + 1 if newline >= 0 else -1) if 0 < c < n]
        if not candidates:
            return None
        cut = min(candidates)
        if text[cut] == " " and cut > 0 and not text[cut - 1].isspace():
            return cut
        if text[cut - 1] == "\n" and not text[cut].isspace() and text[cut] != "/":
            return cut
        pos = cut + 1
    return None


def text_size_over(value: Any, budget: int) -> bool:
    """Whether the strings in ``value`` (nested dicts and lists) hold more than ``budget``
    characters; stops as soon as they do."""
    stack = [value]
    total = 0
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
            if total > budget:
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False


class ChunkedEncoding:
    """A stand-in for a :class:`HarmonyEncoding` that renders long single-text messages in
    short calls; everything else is the encoding's own."""

    def __init__(self, encoding: HarmonyEncoding, slice_chars: int = SLICE_CHARS) -> None:
        self._encoding = encoding
        self._slice = slice_chars

    def __getattr__(self, name: str) -> Any:
        return getattr(self._encoding, name)

    def render(self, message: Message, render_options: RenderOptions | None = None) -> list[int]:
        text = _only_text(message)
        if text is None or len(text) <= self._slice:
            return list(self._encoding.render(message, render_options))
        empty = list(self._encoding.render(_with_text(message, ""), render_options))
        probe_text = "probe <|end|> text"
        probe = list(self._encoding.render(_with_text(message, probe_text), render_options))
        if probe != [*empty[:-1], *self.encode_text(probe_text), *empty[-1:]]:
            return list(self._encoding.render(message, render_options))  # not as expected: whole
        return [*empty[:-1], *self.encode_text(text), *empty[-1:]]

    def encode_text(self, text: str) -> list[int]:
        """``text`` encoded as ordinary text (special tokens in it stay text), slice by slice."""
        out: list[int] = []
        start = 0
        for cut in (*split_points(text, self._slice), len(text)):
            out.extend(self._encoding.encode(text[start:cut], disallowed_special=()))
            start = cut
        return out


def _only_text(message: Message) -> str | None:
    content: Sequence[Any] = message.content
    if len(content) == 1 and isinstance(content[0], TextContent):
        return str(content[0].text)
    return None


def _with_text(message: Message, text: str) -> Message:
    return message.model_copy(update={"content": [TextContent(text=text)]})
