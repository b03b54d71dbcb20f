"""Output token ids -> response events, through Harmony's streaming parser.

:class:`HarmonyDecoder` feeds each generated token to ``openai_harmony.StreamableParser`` and
drives a :class:`~domain.builder.ResponseBuilder`:

- ``analysis`` channel -> a ``reasoning`` item (``reasoning_text`` deltas);
- ``final`` channel -> a ``message`` with ``phase: "final_answer"``;
- ``commentary`` without a recipient (a preamble) -> a ``message`` with ``phase: "commentary"``;
- recipient ``functions.NAME`` on any channel -> a ``function_call`` (the name keeps any dots
  after the prefix), or a ``custom_tool_call`` when NAME is a custom tool, whose ``input`` deltas
  are the decoded string (see :mod:`domain.custom_tools`).

Per token the decoder does as little as it can; the parser's state is only inspected at
Harmony's structural tokens. Inside a message's content, a token whose bytes are whole UTF-8 text
is that text: the decoder appends it without calling the parser (whose ``process`` and
``last_content_delta`` were most of a token's cost), from a table of token texts filled as tokens
are first seen. The parser still sees every structural token. The first token of a message that
is not whole text on its own (a character split across tokens, bytes that are not UTF-8) hands
the rest of that message's content back to the parser, token by token, so how split or invalid
UTF-8 is decoded stays Harmony's: the parser's UTF-8 buffer is empty at that point, as it would
have been had it seen every token (every token before was whole text).

The parser itself is put off until a token needs it (``_Deferred``): Harmony spends ~40 µs on
each header token and ~190 µs making a parser, more than the rest of a short response's decoding.
A header that a parser has read before from the same state is read from what that parser found
(``ParserPool.known``, per encoding), and a message read to its end leaves a parser waiting for
``<|start|>`` whatever its text was, so a response whose headers are known and whose text is
whole UTF-8 never makes one. A header never seen, or a token in content that is not whole text,
makes the parser (from :mod:`domain.parsers`' pool), gives it what was put off, and hands it the
rest. Tests decode random token sequences this way and with a new parser given every token, and
assert the same events.

Recovery from malformed output (the upstream "non-terminal state" bug): the text a model wrote is
never dropped and a response never ends ``completed`` with nothing to show for it.

- A token the parser rejects (``Unexpected token ... while expecting start token 200006``) starts a
  *stray run*: the parser is reset to expect ``<|start|>``, and every token up to the next
  ``<|start|>`` is kept. When the run ends (or generation does), its text -- with Harmony's
  special tokens and role/channel/recipient header words removed -- goes out as a recovered
  ``final_answer`` message.
- Generation that ends inside a header (EOS in a header, ``<|channel|>final {"answer": "hi"}``
  followed by ``<|return|>`` with no ``<|message|>``) recovers the header's content the same way.
- Generation that ends inside a message closes that item with the text streamed so far.
- A special token outside Harmony's grammar (``<|endoftext|>``, ``<|reserved_200711|>``, an id
  past the vocabulary) is dropped before the parser sees it, wherever it comes: in content (the
  parser would keep its text in the message), in a header (it would end up in the recipient, so
  in a function's name) or between messages (it would start a stray run). So no special token's
  text reaches any delta, done value, recovered text, reasoning, tool name, arguments or custom
  tool input; the structural ones that a recovered run holds are removed by
  :func:`strip_harmony_markup`. Each drop is counted in the result's notes.

Log probabilities (``logprobs``, a :class:`~domain.logprobs.TokenTexts`): :meth:`feed_logprobs`
takes each token's ``(logprob, top-k)`` with it, and every ``output_text`` delta carries the
entries of the tokens that made it (the rules are in :mod:`domain.logprobs`). :meth:`feed`, the
path of a request without them, is unchanged.

The decoder reports what happened in :class:`DecodeResult`; the caller logs the warning (with the
response id) and picks the terminal status.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from openai_harmony import HarmonyEncoding, HarmonyError

from domain.builder import ItemStatus, ResponseBuilder
from domain.custom_tools import CustomInputStream
from domain.events import Json
from domain.logprobs import TokenLogprob, TokenTexts
from domain.parsers import Parser, ParserPool, pool_for

__all__ = ["DecodeResult", "HarmonyDecoder", "strip_harmony_markup"]

START, END, MESSAGE, CHANNEL, CONSTRAIN, RETURN, CALL = (
    200006,
    200007,
    200008,
    200005,
    200003,
    200002,
    200012,
)
_MESSAGE_ENDS = frozenset({END, RETURN, CALL})
#: o200k_harmony's special tokens are the ids from here up (<|startoftext|>, <|endoftext|>, ...).
FIRST_SPECIAL = 199998
#: The special tokens Harmony's grammar is made of; every other one (<|endoftext|>, the
#: ``<|reserved_NNNNNN|>`` ids, anything past the vocabulary) means nothing and is dropped.
STRUCTURAL = frozenset({START, END, MESSAGE, CHANNEL, CONSTRAIN, RETURN, CALL})

_SPECIAL = re.compile(r"<\|[a-z_]+\|>")

#: Per encoding (by name): token id -> its text when its bytes are whole UTF-8 on their own, else
#: "" (no token decodes to nothing). Filled as tokens are first decoded; at most the vocabulary.
_TOKEN_TEXTS: dict[str, dict[int, str]] = {}

_LEADING_WORD = re.compile(r"^\s*[^\s<]+")
_ROLE = re.compile(r"^\s*(assistant|user|system|developer|tool)\b")
_RECIPIENT = re.compile(r"(^|\s)to=\S+")


#: Where a :class:`_Deferred` parser starts from: a new assistant parser (a completion's start),
#: or one waiting for ``<|start|>`` (after a message, or malformed output). Never token ids.
_AS_ASSISTANT, _EXPECTING_START = -1, -2
#: Header prefixes longer than this are not remembered (a model writing a runaway header).
_MAX_KNOWN_HEADER = 64


class _Deferred:
    """The decoder's parser while it needs none (see the module docstring): the tokens a parser
    would have read since ``base``, not yet given to one. Known header prefixes are read from
    ``ParserPool.known``; the first token they do not cover makes the parser, which gets the
    tokens put off, and from the header's ``<|message|>`` (or a content token) on the decoder
    calls it directly. A header read that way is remembered up to its ``<|message|>``."""

    __slots__ = ("_base", "_decoder", "_real", "_seen", "current_channel", "current_recipient")

    def __init__(self, decoder: HarmonyDecoder, base: int) -> None:
        self._decoder = decoder
        self._base = base
        self._seen: list[int] = []
        self._real: Any = None
        self.current_channel: str | None = None
        self.current_recipient: str | None = None

    def process(self, token: int) -> None:
        seen = self._seen
        real = self._real
        if real is None:
            known = self._decoder._parsers.known
            header = known.get(
                (self._base, *seen, token), ...
            )  # (one look-up: another thread may clear it)
            if header is not ...:
                seen.append(token)
                if header is not None:
                    self.current_channel, self.current_recipient = header
                return
            if token in _MESSAGE_ENDS and seen and seen[-1] == MESSAGE:
                # the end of a message whose content was all whole text: a parser would now
                # wait for <|start|>
                self._base = _EXPECTING_START
                seen.clear()
                return
            real = self._real = self._decoder._materialize(self._base, seen, token)
            if seen and seen[-1] == MESSAGE:  # in content: the parser takes it from here
                self._decoder._inner = real
                real.process(token)
                return
        real.process(token)  # (a HarmonyError here: the decoder drops this parser)
        seen.append(token)
        if len(seen) <= _MAX_KNOWN_HEADER:
            header = (real.current_channel, real.current_recipient) if token == MESSAGE else None
            self._decoder._parsers.remember((self._base, *seen), header)
        if token == MESSAGE or len(seen) > _MAX_KNOWN_HEADER:
            self._decoder._inner = real


class _Finished:
    """Where a finished decoder's parser was: it went back to the pool (another decode may be
    using it), so any use of it here is a bug, and fails."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError("this decode is finished: its parser went back to the pool")


def strip_harmony_markup(text: str) -> str:
    """Remove Harmony special tokens and header words (role, channel, recipient, constraint).

    Text after ``<|message|>`` is content and kept verbatim; a complete header (one that reached
    ``<|message|>``) is dropped; an unfinished header loses its leading role / channel /
    constraint word and any ``to=RECIPIENT``, and what remains is the model's text.
    """
    pieces = _SPECIAL.split(text)
    markers = [None, *_SPECIAL.findall(text)]
    following = [*markers[1:], None]
    out: list[str] = []
    for marker, piece, after in zip(markers, pieces, following, strict=True):
        if marker == "<|message|>":
            out.append(piece)
            continue
        if after == "<|message|>":
            continue  # a complete header: role, channel, recipient and content type, all markup
        if marker in ("<|channel|>", "<|constrain|>"):
            piece = _LEADING_WORD.sub("", piece, count=1)
        elif marker == "<|start|>":
            piece = _ROLE.sub("", piece, count=1)
        if marker is not None or piece.lstrip().startswith("to="):
            piece = _RECIPIENT.sub("", piece)
        out.append(piece)
    return "".join(out).strip()


@dataclass
class DecodeResult:
    #: True when malformed output had to be recovered (stray tokens or an unfinished header).
    recovered: bool = False
    #: Human-readable notes on what was recovered, for the warning log and the audit record.
    notes: list[str] = field(default_factory=list)
    output_tokens: int = 0
    reasoning_tokens: int = 0
    #: How many function / custom tool calls were opened.
    calls: int = 0
    #: How many special tokens outside Harmony's grammar were dropped.
    dropped_special: int = 0


class HarmonyDecoder:
    """Decodes one generation. Feed token ids with :meth:`feed`, then call :meth:`finish` once."""

    def __init__(
        self,
        encoding: HarmonyEncoding,
        builder: ResponseBuilder,
        *,
        custom_tools: Iterable[str] = (),
        prefill: Sequence[int] = (),
        function_names: Mapping[str, tuple[str, str | None]] | None = None,
        logprobs: TokenTexts | None = None,
        parsers: ParserPool | None = None,
    ) -> None:
        """``custom_tools``: the model-visible names of custom tools; ``function_names``: model-
        visible name -> (declared name, namespace) for functions declared inside a namespace;
        ``prefill``: header tokens the prompt already ended with (a forced tool choice);
        ``logprobs``: given when the tokens come with log probabilities (:meth:`feed_logprobs`).
        ``parsers``: where the Harmony parser comes from and goes back to once the decode is
        finished (:mod:`domain.parsers`; the encoding's shared pool unless given)."""
        self._encoding = encoding
        self._builder = builder
        self._custom_tools = frozenset(custom_tools)
        self._function_names = dict(function_names or {})
        self._parsers = parsers if parsers is not None else pool_for(encoding)
        #: The parser (None until a token needs one: :class:`_Deferred`, :mod:`domain.parsers`)
        #: and its Rust object, which the decoder calls directly (no Python wrapper per token).
        self._parser: Parser | None = None
        self._inner: Any = self._deferred(_AS_ASSISTANT)
        #: The output tokens already counted in the parser's ``read``.
        self._counted = 0
        self._in_content = False
        self._content_kind: str | None = None
        self._custom: CustomInputStream | None = None
        self._header: list[int] = []
        self._stray: list[int] = []
        self._finished = False
        self.result = DecodeResult()
        self._texts = logprobs
        #: Inside content, and every content token so far was whole text: the next one that is
        #: needs no parser (see the module docstring).
        self._fast = False
        self._token_texts = _TOKEN_TEXTS.setdefault(encoding.name, {})
        #: Entries of the message tokens fed since the last output_text delta.
        self._lp_pending: list[Json] = []
        if logprobs is not None:
            self._append = self._append_with_logprobs  # type: ignore[method-assign]
        for token in prefill:
            self._feed_one(token)

    # -- feeding ---------------------------------------------------------------------------------

    def feed(self, token_ids: Iterable[int]) -> None:
        result = self.result
        for token in token_ids:
            result.output_tokens += 1
            if self._content_kind == "reasoning":
                result.reasoning_tokens += 1
            self._feed_one(token)

    def feed_logprobs(self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprob]) -> None:
        """:meth:`feed`, each token with its ``(logprob, [(token id, logprob), ...])``. Needs the
        decoder made with ``logprobs``."""
        texts = self._texts
        if texts is None:
            raise ValueError("feed_logprobs() on a decoder made without logprobs")
        result = self.result
        pending = self._lp_pending
        for token, (logprob, top) in zip(token_ids, logprobs, strict=True):
            result.output_tokens += 1
            kind = self._content_kind
            if kind == "reasoning":
                result.reasoning_tokens += 1
            elif kind == "message" and token < FIRST_SPECIAL:
                pending.append(texts.entry(token, logprob, top))
            self._feed_one(token)

    def _feed_one(self, token: int) -> None:
        if token >= FIRST_SPECIAL and token not in STRUCTURAL:
            self._drop_special(token)
            return
        if self._stray:
            self._feed_stray(token)
            return
        if self._fast and token < FIRST_SPECIAL:
            text = self._token_texts.get(token)
            if text is None:
                text = self._token_text(token)
            if text:
                if "<|" in text:  # as the parser's delta would be (below)
                    text = _SPECIAL.sub("", text)
                if text:
                    self._append(text)
                return
            self._fast = False  # the parser decodes the rest of this message
        if token == START and self._header and not self._in_content:
            # <|start|> inside a header: a new message begins (the header so far is dropped, as
            # below). The parser is not asked to read it there: one made for the assistant role
            # takes it as the recipient's text, a pooled one (its role read from ``<|start|>
            # assistant``) refuses the header's <|message|>, so the events would depend on which
            # parser the decode got (a Hypothesis test found it). One waiting for <|start|> reads
            # the new message's header from here, whichever parser it is.
            self._reset_parser()
        try:
            self._inner.process(token)
        except HarmonyError:
            self._start_stray(token)
            return
        if self._in_content:
            if token in _MESSAGE_ENDS:
                self._close("completed")
                if self._parser is not None:  # the parser waits for <|start|>: not needed until
                    self._give_back()  # a header it has not read comes
            elif token < FIRST_SPECIAL:  # special tokens inside content are markup, not text
                delta = self._inner.last_content_delta
                if delta:
                    if "<|" in delta:  # a special token's text flushed with buffered UTF-8 bytes
                        delta = _SPECIAL.sub("", delta)
                    self._append(delta)
            return
        if token == MESSAGE:
            self._start_content()
        elif token in _MESSAGE_ENDS:
            # A message end inside a header: the parser keeps waiting for <|message|>, which
            # will not come. Recover what the header holds.
            self._recover(self._header, "message ended inside a header")
            self._header = []
            self._reset_parser()
        elif token == START:
            self._header = []
        else:
            self._header.append(token)

    def _token_text(self, token: int) -> str:
        try:
            text: str = self._encoding._inner.decode_bytes([token]).decode("utf-8")
        except Exception:  # not whole UTF-8 (or not in the vocabulary): the parser's to decode
            text = ""
        self._token_texts[token] = text
        return text

    def _drop_special(self, token: int) -> None:
        result = self.result
        result.recovered = True
        result.dropped_special += 1
        if result.dropped_special <= 8:  # a model stuck on one would otherwise fill the log
            result.notes.append(f"special token {token} outside Harmony's grammar dropped")

    def _start_stray(self, token: int) -> None:
        # Whatever header was being read is part of the malformed run.
        self._stray = [*self._header, token]
        self._header = []
        if self._in_content:
            self._close(status="completed")
        self._reset_parser()

    def _feed_stray(self, token: int) -> None:
        if token != START:
            self._stray.append(token)
            return
        stray, self._stray = self._stray, []
        self._recover(stray, "tokens outside any message")
        self._inner.process(token)  # a fresh parser always accepts <|start|>

    def _reset_parser(self) -> None:
        """A parser waiting for ``<|start|>``; the one in use is dropped (it is in error)."""
        self._parser = None
        self._inner = self._deferred(_EXPECTING_START)
        self._in_content = False
        self._fast = False
        self._content_kind = None

    def _deferred(self, base: int) -> Any:
        """The parser until a token needs one (``base``: the state it starts from)."""
        return _Deferred(self, base)

    def _materialize(self, base: int, seen: Sequence[int], token: int) -> Any:
        """The parser a :class:`_Deferred` one stands for: from the pool, given ``seen``
        (tokens it has read before, so it takes them again); ``token`` comes next."""
        pool = self._parsers
        parser = (
            pool.assistant(seen[0] if seen else token)
            if base == _AS_ASSISTANT
            else pool.expecting_start()
        )
        self._parser = parser
        # the tokens put off and ``token``; the output tokens after it, _give_back counts (``feed``
        # counts a token before it is decoded: ``token`` is in the count already, unless prefill)
        parser.read += len(seen) + 1
        self._counted = self.result.output_tokens
        inner = parser.inner
        for known in seen:
            inner.process(known)
        return inner

    def _give_back(self) -> None:
        """If the parser waits for ``<|start|>``, it goes back to the pool (if the pool keeps
        it) and a deferred one waiting for ``<|start|>`` takes its place; else it stays."""
        parser = self._parser
        assert parser is not None
        parser.read += self.result.output_tokens - self._counted
        self._counted = self.result.output_tokens
        if self._parsers.give_back(parser):
            self._parser = None
            self._inner = self._deferred(_EXPECTING_START)

    # -- items -----------------------------------------------------------------------------------

    def _start_content(self) -> None:
        channel = self._inner.current_channel
        recipient = self._inner.current_recipient
        # a structural token in the wrong place of a header (``<|constrain|>`` first) lands in
        # the parser's channel or recipient: it is markup, never a name
        if channel and "<|" in channel:
            channel = _SPECIAL.sub("", channel).strip()
        if recipient and "<|" in recipient:
            recipient = _SPECIAL.sub("", recipient).strip()
        self._header = []
        self._in_content = True
        self._fast = True
        builder = self._builder
        # "functions." with no name: a forced header the model did not complete; not a call
        if recipient and recipient not in ("assistant", "functions."):
            self.result.calls += 1
            name = recipient.removeprefix("functions.")
            if recipient.startswith("functions.") and name in self._custom_tools:
                builder.open_custom_tool_call(name)
                self._custom = CustomInputStream()
                self._content_kind = "custom_tool_call"
            else:
                declared, namespace = self._function_names.get(name, (name, None))
                builder.open_function_call(declared, namespace)
                self._content_kind = "function_call"
        elif channel == "analysis":
            builder.open_reasoning()
            self._content_kind = "reasoning"
        elif channel == "commentary":
            builder.open_message("commentary")
            self._content_kind = "message"
        else:
            builder.open_message("final_answer")
            self._content_kind = "message"

    def _append(self, delta: str) -> None:
        if self._custom is not None:
            delta = self._custom.feed(delta)
        self._builder.append(delta)

    def _append_with_logprobs(self, delta: str) -> None:
        """``_append`` of a decoder made with ``logprobs``: a message's delta takes the entries
        of the tokens fed since the last one."""
        if self._content_kind != "message":
            HarmonyDecoder._append(self, delta)
        elif delta:  # (a flushed special token's text alone leaves nothing)
            entries = list(self._lp_pending)
            self._lp_pending.clear()
            self._builder.append_text(delta, entries)

    def _close(self, status: ItemStatus) -> None:
        if self._custom is not None:
            self._builder.append(self._custom.finish())
            self._custom = None
        self._builder.close_item(status)
        self._in_content = False
        self._fast = False
        self._content_kind = None
        self._lp_pending.clear()  # tokens that made no text (an unfinished character)

    def _recover(self, tokens: Sequence[int], why: str, status: ItemStatus = "completed") -> None:
        if not tokens:
            return
        raw = self._encoding.decode(list(tokens))
        text = strip_harmony_markup(raw)
        self.result.recovered = True
        self.result.notes.append(f"{why}: {raw[:200]!r}")
        if not text:
            return
        self._builder.open_message("final_answer")
        self._builder.append(text)
        self._builder.close_item(status)

    # -- the end ---------------------------------------------------------------------------------

    def finish(self, *, truncated: bool) -> DecodeResult:
        """Close whatever is open. ``truncated``: generation was cut (max tokens, abort, error),
        so an item still open is ``incomplete``. Returns the result; later calls return it again."""
        if self._finished:
            return self.result
        self._finished = True
        status: ItemStatus = "incomplete" if truncated else "completed"
        if self._stray:
            stray, self._stray = self._stray, []
            self._recover(stray, "tokens outside any message", status)
        elif self._in_content:
            self._close(status)
        elif self._header:
            self._recover(self._header, "generation ended inside a header", status)
        self._header = []
        self._in_content = False
        self._fast = False
        self._content_kind = None
        if self._parser is not None:
            self._give_back()
        self._parser = None
        self._inner = _Finished()
        return self.result
