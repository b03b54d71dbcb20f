"""A real uvicorn server on a free loopback port, in a background thread, for end-to-end tests.

httpx's ASGI transport buffers whole bodies, so live-stream behaviour (disconnects, resume,
ordering) is tested over a real socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn

from app import transport
from app.main import create_app
from app.settings import Settings


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RunningServer:
    base_url: str
    app: Any
    server: uvicorn.Server

    @property
    def service(self) -> Any:
        return self.app.state.service

    def stored_responses(self) -> int:
        """The rows of its SQLite database's ``responses`` table, read as an operator would."""
        url: str = self.app.state.settings.database_url
        with sqlite3.connect(url.split("///", 1)[1]) as db:
            return int(db.execute("SELECT count(*) FROM responses").fetchone()[0])


@contextlib.contextmanager
def serve(
    settings: Settings, *, wrap: Callable[[Any], Any] | None = None, **app_kwargs: Any
) -> Iterator[RunningServer]:
    """``wrap``: an ASGI middleware put around the app (a test that watches what reaches it)."""
    port = free_port()
    app = create_app(settings, **app_kwargs)
    served = app if wrap is None else wrap(app)
    server = transport.server(served, settings, host="127.0.0.1", port=port, log_level="warning")
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the server did not start")
        if time.monotonic() > deadline:
            raise TimeoutError("the server did not start within 60 s")
        time.sleep(0.01)
    try:
        yield RunningServer(f"http://127.0.0.1:{port}", app, server)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@contextlib.asynccontextmanager
async def serve_in_loop(app: Any) -> AsyncIterator[str]:
    """``app`` served by uvicorn on a free loopback port in the running event loop (where a
    session-scoped engine such as vLLM's lives); yields the base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
