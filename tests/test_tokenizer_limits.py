"""app.tokenizer_limits: when it finds no run over the limit, o200k's pre-tokeniser cuts no piece
much longer than the limit (checked with o200k's own regex, via the ``regex`` module), and it
finds the runs that are."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app import tokenizer_limits
from app.tokenizer_limits import longest_run

regex = pytest.importorskip("regex")

O200K = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
PIECES = regex.compile(O200K)
SMALL = 6


@pytest.fixture(autouse=True)
def small_limit(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A limit of 6 characters and slices of 5, so short texts exercise every path."""
    monkeypatch.setattr(tokenizer_limits, "MAX_RUN", SMALL)
    monkeypatch.setattr(tokenizer_limits, "_SLICE", 5)
    monkeypatch.setattr(tokenizer_limits, "_SCANNED", tokenizer_limits.OrderedDict())
    tokenizer_limits._patterns.cache_clear()
    yield
    tokenizer_limits._patterns.cache_clear()


_CHARS = st.sampled_from(
    [*"aAé中\u0301😀1٣/!'.-_", " ", "\n", "\r", "\t", "\xa0", "\x1c", "\u3000", "\u2028"]
)


@settings(max_examples=3000, deadline=None, derandomize=True)
@given(st.lists(_CHARS, max_size=60).map("".join))
def test_no_run_found_means_no_long_piece(text: str) -> None:
    longest_piece = max((len(m.group()) for m in PIECES.finditer(text)), default=0)
    if longest_run(text) is None:
        # a piece is one run plus a leading character and a contraction, or a run of symbols
        # plus a run of line breaks
        assert longest_piece <= 2 * SMALL + 4, (text, [m.group() for m in PIECES.finditer(text)])


@pytest.mark.parametrize(
    "text",
    [
        "a" * 7,
        "x " + "中" * 7,
        "!" * 7,
        " " * 7,
        "\n" * 7,
        "ab " + "a\u0301" * 4,
        "a\x1c!\x1c!\x1c!\x1c",
        "😀" * 7,
    ],
)
def test_runs_over_the_limit_are_found(text: str) -> None:
    assert longest_run(text) is not None


def test_a_text_scanned_before_gets_the_same_answer() -> None:
    for text in ["abc def ghi", "x " + "a" * 9, "abc def ghi"]:
        assert longest_run(text) == longest_run(text) == tokenizer_limits._scan(text)


@pytest.mark.parametrize(
    "text", ["a" * 6, "abcdef ghijkl mnopqr", "a.b.c.d.e.f.g.h", "1234567890123", "ab12cd34ef56"]
)
def test_runs_within_the_limit_are_not(text: str) -> None:
    assert longest_run(text) is None
