"""The application factory: ``create_app(settings)`` wires store, engine and service.

Nothing happens at import time. Start-up (the lifespan) migrates the database, loads the Harmony
encoding (offline, see :mod:`app.encoding`), starts the engine, loads or creates the reasoning key,
probes whether the database takes writes, closes responses a previous process left in progress,
starts the repair loop (:mod:`app.repair`), and only then reports ready on ``/health``. A
database that is at the newest schema but cannot be written (read-only, full) does not stop the
start: the server serves reads, answers writes 503, and recovers when the database does.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import gc
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware

from app import ui
from app.auth import KeyAuth
from app.browser import BrowserGuard, allowed_hosts
from app.encoding import load_encoding
from app.engines.protocol import Engine, EngineError
from app.errors import APIError, handle_exception
from app.frontends import ReplicaHeader
from app.http import route_error, routes
from app.keys import KeyRing, is_loopback, keys_required
from app.leases import SingleProcessOnly, check_single_process
from app.limits import KeyLimits
from app.logs import RequestLog
from app.metrics import Metrics
from app.query import QueryParameters
from app.reasoning_crypto import ReasoningCipher, new_key
from app.service import ResponseService
from app.settings import Settings
from app.startup import (
    DATABASE_ERRORS,
    StartupError,
    database_unreachable,
    reported_in_one_line,
)
from app.ui import AuditGate
from domain.errors import DomainError
from persistence.doorbell import doorbell_for
from persistence.errors import StoreError
from persistence.store import EventStore

__all__ = ["build_engine", "create_app", "tune_gc"]

log = logging.getLogger(__name__)


def build_engine(settings: Settings, engine_core: Mapping[str, Any] | None = None) -> Engine:
    """``engine_core``: the vLLM engine core another process started, to attach to
    (``app.frontends``); the echo and scripted engines run in every process."""
    encoding = load_encoding()
    names = settings.model_names
    if settings.engine == "echo":
        from app.engines.echo import EchoEngine

        return EchoEngine(encoding, names)
    if settings.engine == "scripted":
        from app.engines.scripted import ScriptedEngine, load_script

        if not settings.script:
            raise StartupError("--engine scripted needs --script FILE (or RESPONSES_LEDGER_SCRIPT)")
        try:
            script = load_script(settings.script)
        except (OSError, ValueError) as exc:  # (a JSONDecodeError is a ValueError)
            raise StartupError(f"the scripted engine's --script {settings.script}: {exc}") from None
        return ScriptedEngine(encoding, names, script)
    if settings.engine == "vllm":
        from app.engines.vllm import VllmEngine, config_for

        config = config_for(settings)
        return VllmEngine(
            dataclasses.replace(config, prometheus=settings.metrics), core=engine_core
        )
    raise StartupError(f"unknown engine {settings.engine!r}: use echo, scripted or vllm")


async def open_store(settings: Settings) -> EventStore:
    """The settings' store, migrated; a database that cannot be reached or opened (refused,
    unknown host, no such database, wrong password, a URL no driver reads) is a
    ``StartupError`` that names it."""
    from persistence.sql import open_store as open_sql_store

    try:
        return await open_sql_store(
            settings.database_url,
            commit_window_ms=settings.commit_window_ms,
            retry_s=settings.store_retry_s,
            statement_timeout_s=settings.statement_timeout_s,
        )
    except (*DATABASE_ERRORS, StoreError) as exc:
        raise database_unreachable(settings.database_url, exc) from exc


def tune_gc(threshold: tuple[int, int, int]) -> None:
    """Freeze what start-up made (modules, engine, encoding: never garbage, never scanned again)
    and collect less often: the per-token objects are acyclic and short-lived."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*threshold)


def create_app(
    settings: Settings,
    *,
    engine: Engine | None = None,
    store: EventStore | None = None,
    engine_core: Mapping[str, Any] | None = None,
) -> Starlette:
    """``engine`` and ``store`` may be given (tests); otherwise they are built from settings.
    Given ones are started if needed but never stopped or closed here: they belong to the caller.
    ``engine_core``: see :func:`build_engine`."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        own_store = store is None
        the_store = store if store is not None else await open_store(settings)
        try:
            app.state.keys = await _key_ring(settings, the_store)
        except BaseException:
            if own_store:
                await the_store.close()
            raise
        the_engine = engine if engine is not None else build_engine(settings, engine_core)
        await the_engine.start()
        if settings.reasoning_key:
            key = base64.b64decode(settings.reasoning_key)
        else:
            key = await the_store.get_or_create_secret("reasoning_key", new_key)
        # Replicas hear of each other's commits, cancels and departures through it
        # (PostgreSQL's LISTEN/NOTIFY; within this process on SQLite)
        doorbell = getattr(the_store, "doorbell", None)
        own_doorbell = doorbell is None
        if doorbell is None:
            doorbell = doorbell_for(settings.database_url)
            await doorbell.start()
            if hasattr(the_store, "doorbell"):
                the_store.doorbell = doorbell
        service = ResponseService(
            settings,
            the_store,
            the_engine,
            load_encoding(),
            ReasoningCipher(key),
            doorbell=doorbell,
            metrics=app.state.metrics,
        )
        app.state.service = service
        if settings.database_url.startswith("sqlite"):
            try:  # SQLite serves one process: refuse to be a second one (--frontends too)
                check_single_process(await the_store.replicas(), service.replica, time.time())
            except SingleProcessOnly as exc:
                if engine is None:
                    await the_engine.stop()
                if own_store:
                    await the_store.close()
                raise StartupError(str(exc)) from None
        # the first heartbeat (this replica's lease row), and whether the database takes writes:
        # a read-only or full one starts degraded and says so on /health
        await the_store.probe()
        if settings.recover_on_start:
            if the_store.health.failing:
                log.warning(
                    "the database cannot be written (%s): start-up recovery waits until it can",
                    the_store.health.reason,
                )
                service.repairs.schedule_recovery()
            else:
                try:
                    closed = await service.repairs.recover()
                except StoreError as exc:  # it went away meanwhile: the repair loop goes on
                    log.warning("start-up recovery interrupted (%s); the repair loop goes on", exc)
                    service.repairs.schedule_recovery()
                else:
                    if closed:
                        log.warning(
                            "closed %d response(s) left in progress by a previous process",
                            len(closed),
                        )
        service.start()
        if settings.gc_threshold is not None:
            tune_gc(settings.gc_threshold)
        app.state.ready = True
        try:
            yield
        finally:
            app.state.ready = False
            await service.shutdown()
            if own_doorbell:
                if hasattr(the_store, "doorbell"):
                    the_store.doorbell = None
                await doorbell.close()
            if engine is None:  # an engine handed in belongs to the caller
                await the_engine.stop()
            if own_store:
                await the_store.close()

    async def http_exception(request: Any, exc: Exception) -> Any:
        assert isinstance(exc, HTTPException)
        return await handle_exception(request, route_error(request, exc))

    handled: dict[Any, Any] = {HTTPException: http_exception, Exception: handle_exception}
    # Known errors go to ExceptionMiddleware (answered, not re-raised); Exception is the last resort.
    for cls in (APIError, ValidationError, DomainError, EngineError, StoreError):
        handled[cls] = handle_exception
    middleware = [
        Middleware(RequestLog),  # outermost: it sees every answer, a refused key's too
        Middleware(
            BrowserGuard,
            hosts=allowed_hosts(settings.allowed_hosts, settings.host),
            origins=settings.cors_origins,
        ),
        *(
            [
                Middleware(
                    CORSMiddleware,
                    allow_origins=list(settings.cors_origins),
                    allow_methods=["GET", "POST", "DELETE"],
                    allow_headers=["authorization", "content-type", "openai-beta"],
                    max_age=600,
                )
            ]
            if settings.cors_origins
            else []
        ),
        Middleware(KeyAuth),
        Middleware(AuditGate),  # /ui: admins only when keys are required (app.ui)
        *([Middleware(ReplicaHeader)] if settings.frontends > 1 else []),
        # innermost: a query parameter the route does not take is a 400 before it runs
        Middleware(QueryParameters, routes=routes, pages=ui.QUERIES),
    ]
    app = _App(routes=routes, lifespan=lifespan, exception_handlers=handled, middleware=middleware)
    app.state.ready = False
    app.state.settings = settings
    app.state.limits = KeyLimits()
    app.state.metrics = Metrics(enabled=settings.metrics)
    return app


class _App(Starlette):
    """The application: Starlette, whose start-up failures that are ``StartupError`` reach
    uvicorn as their one-line message (``app.startup``)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            send = reported_in_one_line(send)
        await super().__call__(scope, receive, send)


async def _key_ring(settings: Settings, store: EventStore) -> KeyRing:
    """Whether keys are required, and the safe default: a server bound to anything but loopback
    with no key configured does not start unless told to run open."""
    required = await keys_required(settings.require_api_key, settings.api_key, store)
    if not required:
        if not is_loopback(settings.host) and not settings.run_open:
            message = (
                f"refusing to start: bound to {settings.host}, not loopback, and no API key is "
                "configured, so anyone who can reach the port could read and delete every "
                "response. Create a key (responses-ledger keys create --project NAME), set "
                "RESPONSES_LEDGER_API_KEY, or set RESPONSES_LEDGER_RUN_OPEN=true to run open."
            )
            raise StartupError(message)
        log.info(
            "no API key required (%s)", "loopback" if is_loopback(settings.host) else "run open"
        )
    return KeyRing(
        store, required=required, static_key=settings.api_key, cache_s=settings.key_cache_s
    )
