"""Reaching one chosen frontend of ``serve --frontends N`` through its single port.

The kernel hands each new connection to whichever frontend accepts it, and a connection stays
with that process. So a client bound to one frontend is an httpx client of one connection that
asked ``/health`` until the answering replica (``x-responses-ledger-replica``) was the wanted
one, then keeps that connection; a response hook asserts every later answer came from it (a
connection closed and reopened to another frontend fails the test instead of passing it by
luck; httpx keeps an idle connection 5 s by default, this one 600). A stream left before its end closes its connection: hold the frontend again
(``same_frontend``). The server's keep-alive must outlast the test's pauses
(``RESPONSES_LEDGER_HTTP_KEEP_ALIVE_S``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
from openai import OpenAI

__all__ = ["HEADER", "Frontend", "frontend", "other_frontend", "same_frontend"]

HEADER = "x-responses-ledger-replica"


class Frontend:
    """One connection held to one frontend, its replica id, and an SDK client on it."""

    def __init__(self, http: httpx.Client, replica: str, base_url: str) -> None:
        self.http = http
        self.replica = replica
        self.sdk = OpenAI(
            base_url=base_url + "/v1", api_key="unused", http_client=http, max_retries=0
        )

    def close(self) -> None:
        self.sdk.close()
        self.http.close()


def _connect(base_url: str, wanted: Callable[[str], bool], timeout_s: float) -> Frontend:
    deadline = time.monotonic() + timeout_s
    seen: set[str] = set()
    while True:
        http = httpx.Client(
            base_url=base_url,
            limits=httpx.Limits(max_connections=1, keepalive_expiry=600),
            timeout=httpx.Timeout(60),
        )
        replica = http.get("/health").headers[HEADER]
        seen.add(replica)
        if wanted(replica):

            def same_replica(response: httpx.Response, replica: str = replica) -> None:
                answered = response.headers.get(HEADER)
                assert answered == replica, f"answered by {answered}, not {replica} (reconnected?)"

            http.event_hooks["response"] = [same_replica]
            return Frontend(http, replica, base_url)
        http.close()
        assert time.monotonic() < deadline, (
            f"no wanted frontend answered within {timeout_s} s: {seen}"
        )


def frontend(base_url: str, timeout_s: float = 30) -> Frontend:
    """A client held to whichever frontend answers first."""
    return _connect(base_url, lambda _replica: True, timeout_s)


def other_frontend(base_url: str, than: str, timeout_s: float = 30) -> Frontend:
    """A client held to a frontend other than replica ``than`` (new connections until one is)."""
    return _connect(base_url, lambda replica: replica != than, timeout_s)


def same_frontend(base_url: str, replica: str, timeout_s: float = 30) -> Frontend:
    """A client held to the frontend of replica ``replica`` (new connections until it answers)."""
    return _connect(base_url, lambda answered: answered == replica, timeout_s)
