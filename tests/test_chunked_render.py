"""app.chunked_render: a long text encoded slice by slice, and a long message rendered that way,
give exactly Harmony's own tokens."""

from __future__ import annotations

import functools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai_harmony import Author, HarmonyEncoding, Message, Role

from app.chunked_render import ChunkedEncoding, split_points, text_size_over
from app.encoding import load_encoding

# Characters where o200k's pieces begin and end: letters of both cases, digits, marks, symbols,
# "/", every kind of whitespace (with the ones Python and Rust disagree on), CJK, emoji.
_ALPHABET = [
    *"aZé中😀1٣/!'.-_s\u0301",
    " ",
    "  ",
    "\n",
    "\r\n",
    "\t",
    "\xa0",
    "\x1c",
    "\u3000",
    "'s",
]
_TEXTS = st.lists(st.sampled_from(_ALPHABET), max_size=120).map("".join)


@functools.cache
def _encoding() -> HarmonyEncoding:
    return load_encoding()


@settings(
    max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(_TEXTS)
def test_slice_by_slice_is_the_same_encoding(text: str) -> None:
    enc = _encoding()
    assert ChunkedEncoding(enc, slice_chars=3).encode_text(text) == enc.encode(
        text, disallowed_special=()
    )


@settings(max_examples=100, deadline=None, derandomize=True)
@given(_TEXTS, st.sampled_from(["user", "final", "analysis", "call", "tool"]))
def test_a_long_message_renders_as_harmony_renders_it(text: str, kind: str) -> None:
    enc = _encoding()
    text = text + " <|end|> tail " * 3  # longer than the slice, with special-token text in it
    message = {
        "user": Message.from_role_and_content(Role.USER, text),
        "final": Message.from_role_and_content(Role.ASSISTANT, text).with_channel("final"),
        "analysis": Message.from_role_and_content(Role.ASSISTANT, text).with_channel("analysis"),
        "call": Message.from_role_and_content(Role.ASSISTANT, text)
        .with_channel("commentary")
        .with_recipient("functions.f")
        .with_content_type("<|constrain|>json"),
        "tool": Message.from_author_and_content(
            Author.new(Role.TOOL, "functions.f"), text
        ).with_channel("commentary"),
    }[kind]
    assert ChunkedEncoding(enc, slice_chars=4).render(message) == list(enc.render(message))


def test_cuts_fall_only_where_o200k_always_cuts() -> None:
    text = "ab  cd\n\n/ef\n gh ij\nkl"
    cuts = list(split_points(text, every=1))
    # before the first space after "ab"; not after "\n\n" (then "/"), not before " gh" (after a
    # line break); before " ij"; after the line break before "kl"
    assert cuts == [2, text.index(" ij"), text.index("kl")]


def test_text_size_over_counts_nested_strings() -> None:
    value = {"a": ["xx", {"b": "yyy"}], "c": 5}
    assert text_size_over(value, 4) and not text_size_over(value, 5)


def test_one_encoding_rendered_from_several_threads_at_once() -> None:
    """The loop thread and the large-request threads share the encoding (Rust; its calls hold
    the GIL, so they take turns): concurrent renders give each their own right answer."""
    import threading

    enc = _encoding()
    texts = [("word " * 5000) + str(i) for i in range(6)]
    expected = [list(enc.render(Message.from_role_and_content(Role.USER, t))) for t in texts]
    errors: list[BaseException] = []

    def work(offset: int) -> None:
        try:
            chunked = ChunkedEncoding(enc, slice_chars=512)
            for round_ in range(4):
                i = (offset + round_) % len(texts)
                message = Message.from_role_and_content(Role.USER, texts[i])
                assert chunked.render(message) == expected[i]
                assert list(enc.render(message)) == expected[i]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
