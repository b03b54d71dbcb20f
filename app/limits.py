"""Per-key limits: requests per minute and concurrent streams (LiteLLM's virtual-key habit).

Both are set on the key (``keys create --rpm N --max-streams N``) and counted in this process
(replicas each count their own). Over either limit the request is answered 429
``rate_limit_exceeded`` with ``Retry-After``, before anything is generated or stored.

- Requests per minute: a sliding window of the last 60 s per key; ``Retry-After`` is when the
  oldest request in the window leaves it.
- Concurrent streams: a stream (``POST`` with ``stream: true``, ``GET ?stream=true``) takes a
  slot when its route accepts it (:func:`take_stream`) and gives it back when the HTTP exchange
  ends, whichever way (finished, client gone, error): :class:`app.auth.KeyAuth` releases what
  the request took once the route has returned.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, MutableMapping
from typing import Any

from starlette.requests import Request

from app.errors import APIError
from app.keys import Caller

__all__ = ["KeyLimits", "take_stream"]

_WINDOW_S = 60.0
#: Scope keys shared with app.auth.
CALLER = "ledger.caller"
RELEASE = "ledger.release"


class KeyLimits:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._recent: dict[str, deque[float]] = {}
        self._streams: dict[str, int] = {}

    def admit(self, caller: Caller) -> APIError | None:
        """Count a request against its key's rate; the 429 to answer if it is over."""
        limit = caller.requests_per_minute
        if limit is None or caller.key_id is None:
            return None
        now = self._clock()
        recent = self._recent.setdefault(caller.key_id, deque())
        while recent and recent[0] <= now - _WINDOW_S:
            recent.popleft()
        if len(recent) >= limit:
            wait = max(1, math.ceil(recent[0] + _WINDOW_S - now))
            return _too_many(
                f"Rate limit reached for this API key: {limit} requests per minute. "
                f"Try again in {wait} s.",
                wait,
            )
        recent.append(now)
        return None

    def open_stream(self, caller: Caller) -> Callable[[], None]:
        """Take a stream slot (429 if the key has all its streams open); returns the release."""
        limit, key = caller.max_streams, caller.key_id
        if limit is None or key is None:
            return _nothing
        open_now = self._streams.get(key, 0)
        if open_now >= limit:
            raise _too_many(
                f"This API key has {limit} stream(s) open, its limit; "
                "close one or wait for it to finish.",
                1,
            )
        self._streams[key] = open_now + 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            left = self._streams[key] - 1
            if left:
                self._streams[key] = left
            else:
                del self._streams[key]

        return release

    def streams(self, key_id: str) -> int:
        return self._streams.get(key_id, 0)


def take_stream(request: Request) -> None:
    """Take a stream slot for this request's key, held until the HTTP exchange ends."""
    scope: MutableMapping[str, Any] = request.scope
    limits: KeyLimits = request.app.state.limits
    release = limits.open_stream(scope[CALLER])
    scope[RELEASE].append(release)


def _too_many(message: str, retry_after: int) -> APIError:
    return APIError(
        429,
        message,
        type="requests",
        code="rate_limit_exceeded",
        headers={"Retry-After": str(retry_after)},
    )


def _nothing() -> None:
    return None
