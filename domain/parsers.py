"""Harmony streaming parsers, kept for the next decode instead of made anew.

Making an ``openai_harmony.StreamableParser`` costs ~190 µs (openai-harmony copies the
encoding's tables into each one), once per response: with 64 streams that start together, 12 ms
of one core before any of them has its first token. A parser that has read a whole completion
cleanly waits for ``<|start|>``, as a new one made to expect it does. Fed ``<|start|>assistant``,
it reads an assistant message's header, as a new one made for the assistant role does, but the
two are not the same for every header: the role of the first is parsed from the header's text,
so a completion that begins ``!<|channel|>commentary to=functions.get_weather`` was a call to
one and a message to the other (a Hypothesis test found it). They are the same when the
completion begins with ``<|channel|>`` (what the prompt's ``<|start|>assistant`` asks for, and
every forced tool choice's prefill begins with): the role's word then ends at a special token;
and the decoder never gives either one a ``<|start|>`` inside a header (it starts a new message
there with a parser waiting for ``<|start|>``: the two took that one differently, a second case
the test found). So a decoder takes its parser at the first token it gives one: a pooled one
for ``<|channel|>``, a new one for anything else. (Most decodes take none at all:
``domain.decoder`` puts the parser off until a token needs it, and remembers here, in
``ParserPool.known``, what parsers found in the headers they read.)

A parser keeps every token and message it has read (openai-harmony has no way to drop them), so
one is reused only until it has read ``TOKEN_CAP`` tokens, and at most ``POOL_SIZE`` wait here per
encoding; ``known`` holds at most ``KNOWN_SIZE`` prefixes of at most 64 tokens: what this module
holds stays under a few MiB whatever the traffic. A test decodes random
token sequences with fresh and with reused parsers and asserts the same events
(``tests/domain/test_decoder.py``).
"""

from __future__ import annotations

from typing import Any

from openai_harmony import HarmonyEncoding, Role, StreamableParser

__all__ = ["KNOWN_SIZE", "POOL_SIZE", "TOKEN_CAP", "Parser", "ParserPool", "pool_for"]

#: At most this many parsers wait per encoding (enough for a burst of that many new streams).
POOL_SIZE = 256
#: A parser that has read this many tokens is not reused (what it keeps grows with them).
TOKEN_CAP = 4096
#: At most this many header prefixes are remembered per encoding (then they are forgotten at once).
KNOWN_SIZE = 8192
_EXPECT_START = '{"state":"ExpectStart"}'


class Parser:
    """A parser (its Rust object, which the decoder calls directly) and about how many tokens it
    has read, counted by its users (a forced tool choice's few prefill tokens may be missed)."""

    __slots__ = ("inner", "read")

    def __init__(self, inner: Any, read: int = 0) -> None:
        self.inner = inner
        self.read = read


class ParserPool:
    """The parsers of one encoding waiting for a decode."""

    def __init__(
        self, encoding: HarmonyEncoding, *, size: int = POOL_SIZE, token_cap: int = TOKEN_CAP
    ) -> None:
        self._encoding = encoding
        self._size = size
        self._cap = token_cap
        self._idle: list[Parser] = []
        #: How many parsers were made (not taken from the pool).
        self.made = 0
        #: Header prefixes a parser has read, from a starting state (see ``domain.decoder``'s
        #: ``_Deferred``): ``(state, *tokens)`` -> None, or at ``<|message|>`` the channel and
        #: recipient the parser read.
        self.known: dict[tuple[int, ...], tuple[str | None, str | None] | None] = {}
        #: ``<|start|>assistant``: what a waiting parser reads to be a new assistant parser.
        self._assistant = tuple(
            encoding.encode("<|start|>assistant", allowed_special={"<|start|>"})
        )
        (self._channel,) = encoding.encode("<|channel|>", allowed_special={"<|channel|>"})

    def __len__(self) -> int:
        return len(self._idle)

    def remember(
        self, prefix: tuple[int, ...], header: tuple[str | None, str | None] | None
    ) -> None:
        """A parser read ``prefix`` from its starting state (``header``: at ``<|message|>``, the
        channel and recipient it read). Past ``KNOWN_SIZE`` prefixes, all are forgotten first."""
        known = self.known
        if len(known) >= KNOWN_SIZE:
            known.clear()
        known[prefix] = header

    def assistant(self, first: int) -> Parser:
        """A parser for a completion whose first token is ``first`` (not yet given to it): one
        from the pool if ``first`` is ``<|channel|>`` (see the module docstring), else a new one."""
        if first == self._channel:
            try:
                parser = self._idle.pop()
            except IndexError:  # (a decoder may be made in a worker thread: no test-then-pop)
                pass
            else:
                for token in self._assistant:
                    parser.inner.process(token)
                parser.read += len(self._assistant)
                return parser
        self.made += 1
        return Parser(StreamableParser(self._encoding, Role.ASSISTANT)._inner)

    def expecting_start(self) -> Parser:
        """A parser waiting for ``<|start|>`` (after a message, or malformed output)."""
        try:
            return self._idle.pop()
        except IndexError:
            self.made += 1
            return Parser(StreamableParser(self._encoding, None)._inner)

    def give_back(self, parser: Parser) -> bool:
        """Keep ``parser`` for another decode if it waits for ``<|start|>`` (a message read to
        its end), has read less than the cap, and the pool has room; else let it go. Whether it
        was waiting for ``<|start|>``."""
        if parser.inner.state != _EXPECT_START:
            return False
        if len(self._idle) < self._size and parser.read < self._cap:
            self._idle.append(parser)
        return True


_POOLS: dict[str, ParserPool] = {}


def pool_for(encoding: HarmonyEncoding) -> ParserPool:
    """The shared pool of ``encoding`` (by name: one encoding object or another of the same
    name have the same tables)."""
    pool = _POOLS.get(encoding.name)
    if pool is None:
        pool = _POOLS[encoding.name] = ParserPool(encoding)
    return pool
