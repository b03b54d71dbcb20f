from __future__ import annotations

import json

import pytest

from persistence.records import (
    StoredEvent,
    check_json_text,
    dump_json,
    pack_token_ids,
    unpack_token_ids,
)


def test_token_ids_are_uint32_little_endian() -> None:
    assert pack_token_ids([1, 256, 2**32 - 1]) == bytes.fromhex("0100000000010000ffffffff")
    assert unpack_token_ids(pack_token_ids(range(1000))) == tuple(range(1000))
    assert pack_token_ids([]) == b""
    with pytest.raises(OverflowError):
        pack_token_ids([-1])
    # one token (a paced engine's step) takes its own path: the same bytes, the same refusal
    assert pack_token_ids((7,)) == pack_token_ids([7, 8])[:4] == bytes.fromhex("07000000")
    with pytest.raises(OverflowError):
        pack_token_ids([2**32])


def test_dump_json_is_compact_and_keeps_unicode() -> None:
    assert dump_json({"a": [1, "é"]}) == '{"a":[1,"é"]}'
    with pytest.raises(ValueError):
        dump_json({"x": float("inf")})


@pytest.mark.parametrize(
    ("value", "refused"),
    [
        ("a\x00b", True),
        ("\\\x00", True),
        ("\\u0000", False),  # a backslash followed by "u0000": plain text
        ("\\\\u0000", False),
        ("nothing", False),
    ],
)
def test_nul_is_refused_wherever_it_is(value: str, refused: bool) -> None:
    text = json.dumps({"v": value})
    stored = StoredEvent(
        0, "t", payload_json=text
    )  # (its own pre-check hands on what may hold one)
    if refused:
        with pytest.raises(ValueError):
            check_json_text(text)
        with pytest.raises(ValueError):
            stored.payload_text()
    else:
        assert check_json_text(text) == text
        assert stored.payload_text() == text


def test_a_raw_nul_in_given_json_text_is_refused_too() -> None:
    with pytest.raises(ValueError):
        StoredEvent(0, "t", payload_json='{"v":"a\x00b"}').payload_text()


def test_payload_text_prefers_the_given_json() -> None:
    event = StoredEvent(0, "t", {"a": 1}, '{ "a" : 1 }')
    assert event.payload_text() == '{ "a" : 1 }'
    assert StoredEvent(0, "t", {"a": 1}).payload_text() == '{"a":1}'


def test_stored_event_parses_its_text_only_when_asked_and_stays_immutable() -> None:
    from_text = StoredEvent(
        4, "response.output_text.delta", payload_json='{"delta":"hi","output_index":0}'
    )
    assert from_text._payload is None  # nothing parsed yet: a streamed token is never read back
    assert from_text.payload == {"delta": "hi", "output_index": 0}
    assert from_text == StoredEvent(
        4, "response.output_text.delta", {"output_index": 0, "delta": "hi"}
    )
    assert from_text != StoredEvent(
        5, "response.output_text.delta", {"output_index": 0, "delta": "hi"}
    )
    assert from_text.payload_text() == '{"delta":"hi","output_index":0}'  # verbatim
    assert StoredEvent(0, "t", {"a": 1}).payload_text() == '{"a":1}'
    with pytest.raises(AttributeError, match="immutable"):
        from_text.seq = 9  # type: ignore[misc]
    with pytest.raises(TypeError, match="payload or payload_json"):
        StoredEvent(0, "t")
    with pytest.raises(TypeError):
        hash(from_text)
