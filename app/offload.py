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
import contextlib
import contextvars
import functools
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

__all__ = ["SWITCH_S", "WORKERS", "run"]

#: Threads for large requests' CPU work.
WORKERS = 2
#: How much lower their CPU priority is than the event loop's (a nice increment).
NICE = 10
#: The thread switch interval while they work (seconds; Python's default is 0.005).
SWITCH_S = 0.0005

P = ParamSpec("P")
T = TypeVar("T")

_executor: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None:  # made on first use, never at import
            _executor = ThreadPoolExecutor(
                max_workers=WORKERS, thread_name_prefix="large-request", initializer=_lower_priority
            )
        return _executor


_in_flight = 0
_normal_interval = sys.getswitchinterval()


def _lower_priority() -> None:
    """Linux gives each thread its own nice value: the large-request threads take CPU the event
    loop does not want (on a busy machine the loop thread was otherwise starved of CPU)."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)


async def run(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` in one of the large-request threads (with this task's context).

    While any such call runs, the interpreter's thread switch interval is :data:`SWITCH_S`
    instead of the default 5 ms. Every system call of the event loop (each socket write, each
    poll) lets go of the GIL; a busy worker thread then keeps it until the loop has waited a
    whole interval for it, so at 5 ms a loop turn that writes to 32 streams took over 100 ms
    (measured: inter-event p99 154 ms, max 448 ms while 8 and 16 MB requests were rendered)."""
    global _in_flight, _normal_interval
    context = contextvars.copy_context()
    call = functools.partial(context.run, fn, *args, **kwargs)
    with _lock:  # several event loops may share the process (the tests run servers in threads)
        if _in_flight == 0:
            _normal_interval = sys.getswitchinterval()
            sys.setswitchinterval(SWITCH_S)
        _in_flight += 1
    try:
        return await asyncio.get_running_loop().run_in_executor(_pool(), call)
    finally:
        with _lock:
            _in_flight -= 1
            if _in_flight == 0:
                sys.setswitchinterval(_normal_interval)
