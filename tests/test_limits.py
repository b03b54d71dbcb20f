"""app.limits: the per-key sliding minute and stream slots, on a fake clock."""

from __future__ import annotations

import pytest

from app.errors import APIError
from app.keys import Caller
from app.limits import KeyLimits


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_requests_per_minute_is_a_sliding_window() -> None:
    clock = _Clock()
    limits = KeyLimits(clock)
    caller = Caller("p", "member", "key_1", requests_per_minute=2)
    assert limits.admit(caller) is None
    clock.now += 20
    assert limits.admit(caller) is None
    refused = limits.admit(caller)
    assert refused is not None and refused.status == 429 and refused.code == "rate_limit_exceeded"
    assert refused.headers == {"Retry-After": "40"}  # when the first request leaves the window
    other = Caller("p", "member", "key_2", requests_per_minute=2)
    assert limits.admit(other) is None  # counted per key
    clock.now += 40
    assert limits.admit(caller) is None  # the first one left
    assert limits.admit(caller) is not None  # the 20 s one is still in


def test_keys_without_limits_and_keyless_callers_are_never_counted() -> None:
    limits = KeyLimits(_Clock())
    for caller in (Caller("p", "member", "key_1"), Caller("default", "admin", None, 1, 1)):
        for _ in range(100):
            assert limits.admit(caller) is None
            limits.open_stream(caller)


def test_stream_slots_are_taken_and_given_back_once() -> None:
    limits = KeyLimits(_Clock())
    caller = Caller("p", "member", "key_1", max_streams=2)
    first = limits.open_stream(caller)
    second = limits.open_stream(caller)
    with pytest.raises(APIError) as refused:
        limits.open_stream(caller)
    assert refused.value.status == 429 and refused.value.headers == {"Retry-After": "1"}
    first()
    first()  # a second release gives nothing back twice
    assert limits.streams("key_1") == 1
    third = limits.open_stream(caller)
    second()
    third()
    assert limits.streams("key_1") == 0
