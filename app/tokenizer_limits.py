"""Text that the Harmony tokenizer cannot take: one pre-token that is too long.

openai-harmony (0.0.8) tokenises with o200k's pre-tokenising regex and then byte-pair merges each
piece the regex cut. Both are quadratic in the length of one piece, and the regex crate's
backtracking runs out of stack on very long ones, which panics in Rust: pyo3 raises
``PanicException``, a ``BaseException`` that escapes every ``except Exception`` (uvicorn then
answered text/plain 500). Measured on this machine, one message rendered alone:

=========================  ==========  ==========  ==========  =============
one run of                 4,096 ch.   16,384 ch.  32,768 ch.  1 MiB
=========================  ==========  ==========  ==========  =============
``a``                      6 ms        88 ms       359 ms      panic
CJK letters (random)       29 ms       465 ms      1.9 s       (not tried)
``!``                      5 ms        89 ms       363 ms      (not tried)
spaces / newlines          (100,000 ch.: 3.5 s)                panic
=========================  ==========  ==========  ==========  =============

while ordinary text costs about 70 ns a character whatever its length (16 MB of words: 1.1 s).
So a request may not hold a run of more than :data:`MAX_RUN` characters that the regex would
take as one piece; :func:`longest_run` finds such runs without the regex (the ``regex`` module is
not a dependency): a piece of o200k is at most one character plus a run of letters (Unicode
``L*``/``M*``), a run of "other" characters (not whitespace, not a letter, not a number) plus
line breaks, or a run of whitespace, so runs of each of those three classes bound every piece.

4,096 characters is far above any word, identifier or line of minified code a client sends
(Chinese and Thai text, which has no spaces, is cut by its punctuation), and it keeps the worst
case at about 7 µs a character (CJK), 100 times ordinary text: a 16 MB body of such runs still
costs a CPU for tens of seconds, which is why large bodies are rendered off the event loop.

Scans hold the GIL (``re`` does not release it), so long strings are scanned in slices of
:data:`_SLICE` characters: between slices another thread (the event loop) gets its turn.
"""

from __future__ import annotations

import functools
import re
import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["MAX_RUN", "longest_run"]

#: The longest run of one pre-token class a request may hold (characters).
MAX_RUN = 4096
#: Characters scanned by one ``re`` call (a few ms at most).
_SLICE = 1 << 16

#: Unicode White_Space, what Rust's ``\s`` matches (Python's ``\s`` also takes U+001C-U+001F,
#: which Rust counts as "other" characters: that difference must not hide a run).
_WHITE = "\t-\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"


def _run_pattern(cls: str) -> re.Pattern[str]:
    # The lookbehind lets a match start only where a run starts, so the scan is linear: without
    # it, a run just short of the limit would be counted again from each of its characters.
    return re.compile(f"(?<![{cls}])[{cls}]{{{MAX_RUN + 1}}}")


@functools.cache
def _patterns() -> tuple[re.Pattern[str], re.Pattern[str], re.Pattern[str], re.Pattern[str]]:
    """Built on first use (about 0.1 s: every BMP code point's category is looked up once).

    Every class is written as a negated set of BMP code points, which ``re`` compiles to a
    lookup table (a set that names code points above U+FFFF is matched range by range, ~50
    times slower). So code points above U+FFFF count as letters *and* as "other" characters:
    a run of them is bounded too, at the price of refusing a 4,096-character run of emoji and
    punctuation that Harmony could take."""
    not_letters = _ranges(lambda c: c[0] not in "LM")
    letters_or_numbers = _ranges(lambda c: c[0] in "LMN")
    return (
        _run_pattern(f"^{_WHITE}"),  # not whitespace: the cheap first test
        _run_pattern(_WHITE),
        _run_pattern(f"^{not_letters}"),
        _run_pattern(f"^{_WHITE}{letters_or_numbers}"),
    )


def _ranges(wanted: Callable[[str], bool]) -> str:
    """A set body naming the BMP code points whose Unicode category is ``wanted``."""
    out: list[str] = []
    start = None
    for cp in range(0x10001):
        inside = cp <= 0xFFFF and wanted(unicodedata.category(chr(cp)))
        if inside and start is None:
            start = cp
        elif not inside and start is not None:
            out.append(f"\\u{start:04x}-\\u{cp - 1:04x}")
            start = None
    return "".join(out)


def _find(
    pattern: re.Pattern[str], text: str, start: int = 0, end: int | None = None
) -> int | None:
    """Where the first run that ``pattern`` matches starts in ``text[start:end]``, slice by
    slice; runs that start in one slice and end in the next are found (the slice is extended by
    the run length)."""
    end = len(text) if end is None else end
    for pos in range(start, end, _SLICE):
        found = pattern.search(text, pos, min(end, pos + _SLICE + MAX_RUN + 1))
        if found is not None and found.start() < pos + _SLICE:
            return found.start()
    return None


#: Texts already scanned, with the answer: clients send the same long instructions every turn
#: (Codex: 17,000 characters, 0.45 ms to scan, 10 µs to look up). Only texts up to
#: ``_CACHED_MAX`` characters are kept, so the cache holds at most 8 Mi characters.
_SCANNED: OrderedDict[str, int | None] = OrderedDict()
_SCANNED_MAX = 128
_CACHED_MAX = 64 * 1024
_SCANNED_LOCK = threading.Lock()


def longest_run(text: str) -> int | None:
    """The start of a run in ``text`` longer than :data:`MAX_RUN` characters that Harmony's
    tokenizer would take as one piece (or close to one), else None."""
    if len(text) <= MAX_RUN:
        return None
    if len(text) > _CACHED_MAX:
        return _scan(text)
    with _SCANNED_LOCK:
        if text in _SCANNED:
            _SCANNED.move_to_end(text)
            return _SCANNED[text]
    found = _scan(text)
    with _SCANNED_LOCK:
        _SCANNED[text] = found
        if len(_SCANNED) > _SCANNED_MAX:
            _SCANNED.popitem(last=False)
    return found


def _scan(text: str) -> int | None:
    not_white, white, letters, others = _patterns()
    found = _find(white, text)
    if found is not None:
        return found
    pos = 0
    while (start := _find(not_white, text, pos)) is not None:
        # the whole non-white run: look inside it for a run of letters or of "other" characters
        end = _next_white(text, start)
        for pattern in (letters, others):
            inner = _find(pattern, text, start, end)
            if inner is not None:
                return inner
        pos = end
    return None


_WHITE_RE = re.compile(f"[{_WHITE}]")


def _next_white(text: str, pos: int) -> int:
    """The index of the next whitespace at or after ``pos`` (or the end), slice by slice."""
    while pos < len(text):
        found = _WHITE_RE.search(text, pos, min(len(text), pos + _SLICE))
        if found is not None:
            return found.start()
        pos = min(len(text), pos + _SLICE)
    return len(text)
