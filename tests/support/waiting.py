"""Waiting in a test for something another task, thread or process does."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

__all__ = ["eventually"]


async def eventually(
    check: Callable[[], Awaitable[bool] | bool], what: str, timeout_s: float = 5.0
) -> None:
    """Return once ``check()`` (plain or awaitable) is true, polling every 10 ms; fail the test
    saying ``what`` did not happen if it is still false after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result if isinstance(result, bool) else await result:
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.01)
