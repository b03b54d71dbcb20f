"""A small executor of its own for the CPU work of large requests.

Parsing, checking and rendering a body of several megabytes takes from tens of milliseconds to
seconds of CPU; on the event loop that stalls every other stream for as long. Such work runs
here instead: in threads, so the loop keeps its turns (Python switches threads every 5 ms; work
that holds the GIL for longer, such as openai-harmony's Rust calls, must be cut into short calls
by its caller, see :mod:`app.chunked_render`). Two threads, not the loop's default executor: a
burst of large requests queues here and cannot take the threads other work needs.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

__all__ = ["WORKERS", "run"]

#: Threads for large requests' CPU work.
WORKERS = 2

P = ParamSpec("P")
T = TypeVar("T")

_executor: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None:  # made on first use, never at import
            _executor = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="large-request")
        return _executor


async def run(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` in one of the large-request threads (with this task's context)."""
    context = contextvars.copy_context()
    call = functools.partial(context.run, fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_pool(), call)
