"""Several frontend processes on one port over one engine: ``responses-ledger serve --frontends N``.

One Python process saturates near 16,000 paced tokens/s (issue 20); a large engine makes more.
So the parent process binds the listening socket once and starts N *frontends*, each a whole
server (``app.main.create_app`` under ``app.transport``'s uvicorn) accepting on that same socket;
the kernel hands each new connection to one of them. No frontend knows which process a client
reaches, and none needs to:

- **Each frontend is a replica** (``app.leases``): its own replica id, lease and heartbeat, the
  owner of the responses it creates. The ledger is shared through the database and the
  replicas' doorbell (``persistence.doorbell``), so a follower on one frontend hears the events
  another appends, a cancel or ``DELETE`` through one reaches the owner, ``previous_response_id``
  resolves anywhere. That needs PostgreSQL: SQLite serves one process (its doorbell is inside
  one process, and ``app.leases`` refuses a second process), so ``--frontends N`` with N > 1 on
  SQLite is refused at start with a message that says so.
- **One vLLM engine core**, as ``vllm serve --api-server-count N`` does it: the parent binds the
  engine's ZMQ listeners for N clients (``bind_engine_zmq_listeners``), starts the engine core
  once (``launch_core_engines``), and hands each frontend its listeners with ``client_count``
  and ``client_index``; each frontend's ``AsyncLLM`` attaches to the core with them
  (``VllmEngine(core=...)``). The echo and scripted engines run inside every frontend.
- **Signals**: SIGTERM (or SIGINT) to the parent is passed to every frontend, which drains
  (``app.drain``) as a lone replica would; the parent waits for them, then stops the engine
  core. Frontends stopped together do not hand their responses to each other (all are going):
  only replicas outside the group count as the "others" a drain hands over to. A frontend (or
  the engine core) that exits on its own stops the whole group (exit status 1), as vLLM's API
  servers do; what a killed frontend left is taken over by replicas outside the group, or at
  the next start (``app.takeover``).
- **Which frontend answered**: with N > 1 every HTTP response carries
  ``x-responses-ledger-replica`` (the replica id), for operators and tests.

Processes are started with ``multiprocessing``'s spawn context (vLLM's, and safe with threads
and CUDA); the socket and ZMQ listeners travel to the children as duplicated descriptors.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import Any

from app.settings import Settings, SettingsError
from app.startup import DATABASE_ERRORS, cannot_listen, database_unreachable
from persistence.records import Replica

__all__ = ["ReplicaHeader", "group_peers", "serve"]

log = logging.getLogger(__name__)

#: The header naming the replica (frontend) that answered.
REPLICA_HEADER = b"x-responses-ledger-replica"
#: Beyond the drains' own deadlines (``drain_s`` twice), how long the parent waits for its
#: frontends to exit after a signal before it kills them.
_EXIT_GRACE_S = 15.0


@dataclasses.dataclass
class _Group:
    """What a frontend knows of its siblings (set in each frontend process by ``_frontend``)."""

    index: int
    #: The frontends' pids, filled in by the parent as it starts them (0: not started yet).
    pids: Any
    #: Set by the parent before it passes a stop signal on: the whole group is going.
    stopping: Any


_group: _Group | None = None


def group_peers(rows: Sequence[Replica], me: Replica) -> set[str]:
    """The ids of ``rows`` that are frontends of this process's group while the group stops
    together (they take over nothing, so a drain must not hand them anything); empty otherwise."""
    group = _group
    if group is None or not group.stopping.is_set():
        return set()
    pids = {pid for pid in group.pids if pid}
    return {row.id for row in rows if row.host == me.host and row.pid in pids and row.id != me.id}


class ReplicaHeader:
    """ASGI middleware: ``x-responses-ledger-replica: <replica id>`` on every response."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        service = getattr(scope["app"].state, "service", None)
        if service is None:
            await self.app(scope, receive, send)
            return
        replica = service.replica.id.encode()

        async def send_with_replica(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {
                    **message,
                    "headers": [*message.get("headers", ()), (REPLICA_HEADER, replica)],
                }
            await send(message)

        await self.app(scope, receive, send_with_replica)


def _refusal(settings: Settings) -> str | None:
    if settings.frontends > 1 and not settings.database_url.startswith("postgresql"):
        return (
            f"--frontends {settings.frontends} needs PostgreSQL: every frontend is a replica, and "
            "SQLite serves one server process (its doorbell does not cross processes). Set "
            "DATABASE_URL=postgresql+asyncpg://... or run one frontend."
        )
    return None


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound once here; every frontend accepts on it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.create_server((host, port), family=family, backlog=4096)
    except OSError as exc:
        raise cannot_listen(host, port, exc) from None
    sock.set_inheritable(True)
    return sock


def serve(settings: Settings) -> int:
    """Run ``settings.frontends`` frontends on ``settings.host:port`` until a signal; the exit
    status (0 after a signal, 1 if a frontend or the engine core stopped on its own)."""
    refusal = _refusal(settings)
    if refusal:
        raise SettingsError(refusal)
    count = settings.frontends
    ctx = multiprocessing.get_context("spawn")
    stop: list[int] = []
    starting = True

    def on_signal(signum: int, _frame: Any) -> None:
        stop.append(signum)
        if starting:  # the engine core may still be loading: abandon the start
            raise SystemExit(128 + signum)

    from persistence import migrate

    try:  # once here, not N times at once in the frontends
        migrate.upgrade(settings.database_url)
    except DATABASE_ERRORS as exc:
        raise database_unreachable(settings.database_url, exc) from exc
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    sock = _bind(settings.host, settings.port)
    group_pids = ctx.Array("i", count, lock=False)
    stopping = ctx.Event()
    frontends: list[BaseProcess] = []

    def start(cores: Sequence[Mapping[str, Any] | None]) -> list[BaseProcess]:
        for index in range(count):
            proc = ctx.Process(
                target=_frontend,
                name=f"frontend-{index}",
                args=(settings, sock, index, cores[index], group_pids, stopping),
            )
            proc.start()
            group_pids[index] = proc.pid or 0
            frontends.append(proc)
        return frontends

    status = 1
    try:
        with _engine_core(settings, count, start) as core_processes:
            starting = False
            log.info(
                "%d frontends (pids %s) on http://%s:%d",
                count,
                ", ".join(str(p.pid) for p in frontends),
                settings.host,
                settings.port,
            )
            status = _supervise(settings, frontends, core_processes, stop, stopping)
    finally:
        stopping.set()
        _stop_all(frontends, signal.SIGTERM, 2 * settings.drain_s + _EXIT_GRACE_S)
        sock.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return status


def _supervise(
    settings: Settings,
    frontends: Sequence[BaseProcess],
    core_processes: Sequence[BaseProcess],
    stop: list[int],
    stopping: Any,
) -> int:
    """Wait for a signal (passed on to every frontend) or for a process to end on its own."""
    watched = {p.sentinel: p for p in (*frontends, *core_processes)}
    while not stop:
        ended = wait(list(watched), timeout=0.2)
        if ended:
            proc = watched[ended[0]]  # type: ignore[index]
            # its sentinel (a pipe) closes as the kernel tears the process down, a moment
            # before it can be reaped: join(0) could still read no exit code
            proc.join(5)
            log.error(
                "%s (pid %s) exited (%s): stopping the others", proc.name, proc.pid, proc.exitcode
            )
            return 1
    stopping.set()
    signum = stop[0]
    log.warning("signal %d: passing it to %d frontends", signum, len(frontends))
    for proc in frontends:
        if proc.is_alive() and proc.pid:
            os.kill(proc.pid, signum)
    _wait_all(frontends, 2 * settings.drain_s + _EXIT_GRACE_S)
    return 0


def _wait_all(procs: Sequence[BaseProcess], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))


def _stop_all(procs: Sequence[BaseProcess], signum: int, timeout_s: float) -> None:
    """``signum`` to those still running, then SIGKILL to those still running after ``timeout_s``."""
    for proc in procs:
        if proc.is_alive() and proc.pid:
            os.kill(proc.pid, signum)
    _wait_all(procs, timeout_s)
    for proc in procs:
        if proc.is_alive():
            log.error("%s (pid %s) did not stop: killing it", proc.name, proc.pid)
            proc.kill()
            proc.join(5)


@contextlib.contextmanager
def _engine_core(
    settings: Settings,
    count: int,
    start: Callable[[Sequence[Mapping[str, Any] | None]], list[BaseProcess]],
) -> Iterator[list[BaseProcess]]:
    """Start the frontends with ``start`` (given each frontend's link to the engine core) and
    yield the engine core's processes once it is ready; the core stops when the block ends.
    For vLLM the core is started once here and each link is the frontend's ZMQ listeners with
    ``client_count`` and ``client_index`` (vLLM's ``--api-server-count``); the echo and scripted
    engines have no core (None: each frontend runs its own)."""
    if settings.engine != "vllm":
        start([None] * count)
        yield []
        return
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.utils import bind_engine_zmq_listeners, launch_core_engines
    from vllm.v1.executor import Executor

    from app.engines.vllm import config_for

    config = config_for(settings)
    engine_args = AsyncEngineArgs(**config.engine_args())
    engine_args._api_process_count = count
    engine_args._api_process_rank = -1
    vllm_config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    listeners = bind_engine_zmq_listeners(vllm_config, count)
    manager = coordinator = None
    try:
        executor = Executor.get_class(vllm_config)
        log_stats = not engine_args.disable_log_stats
        with launch_core_engines(vllm_config, executor, log_stats, listeners.addresses) as launch:
            manager, coordinator = launch.engine_manager, launch.coordinator
            cores: list[Mapping[str, Any] | None] = []
            pairs = zip(listeners.inputs, listeners.outputs, strict=True)
            for index, (inputs, outputs) in enumerate(pairs):
                core: dict[str, Any] = {
                    "input_address": inputs.address,
                    "output_address": outputs.address,
                    "input_listener": inputs.socket,
                    "output_listener": outputs.socket,
                    "client_count": count,
                    "client_index": index,
                }
                if coordinator is not None:
                    core["stats_update_address"] = coordinator.get_stats_publish_address()
                cores.append(core)
            # the frontends' AsyncLLMs take their part in the start-up handshake; the block's
            # end waits for the core, and fails if a frontend dies first
            launch.watched_frontend_processes = start(cores)
            for listener in (*listeners.inputs, *listeners.outputs):
                listener.close()  # the frontends hold their own copies
        log.info("vLLM engine core ready for %d frontends", count)
        yield list(getattr(manager, "processes", []))
    finally:
        listeners.cleanup()
        del listeners  # vLLM's __del__ cleans up again, which fails at interpreter exit
        if manager is not None:
            manager.shutdown(timeout=settings.drain_s)
        if coordinator is not None:
            coordinator.shutdown(timeout=settings.drain_s)


def _frontend(
    settings: Settings,
    sock: socket.socket,
    index: int,
    core: Mapping[str, Any] | None,
    pids: Any,
    stopping: Any,
) -> None:
    """One frontend process: the whole server on the shared socket."""
    global _group
    _group = _Group(index=index, pids=pids, stopping=stopping)
    from app import logs

    logs.configure(settings.log_level, settings.log_format)  # as the parent and one-process serve
    from app import transport
    from app.main import create_app

    app = create_app(settings, engine_core=core)
    server = transport.server(app, settings)
    server.run(sockets=[sock])
    if not server.started:
        sys.exit(3)
