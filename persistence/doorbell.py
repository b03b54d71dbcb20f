"""Doorbells: "look again" signals between replicas, sent after the commit, never inside it.

A follower of a response (an SSE resume on replica B while replica A generates it), a cancel
that must reach the owner, a lease released so the others sweep at once: each needs to learn
*that* something changed, never *what*. The store is the truth; the doorbell only says when to
read it again. So a ring carries no payload and is coalesced, and everything it prompts must
also happen, later, by polling: a lost ring delays, never loses.

    ring(channel)                        # after the commit that made the change durable
    with doorbell.listen(channel) as listener:
        while True:
            ...read the store...
            if nothing new:
                await listener.wait(poll_s)  # True: rung (look again); False: poll anyway

``PgDoorbell`` rides on PostgreSQL ``LISTEN``/``NOTIFY`` with two dedicated connections per
process, one listening and one sending:

- Sending is one statement per burst, autocommit (its own tiny transaction, never the one that
  wrote the events: ``NOTIFY`` inside a commit takes a cluster-wide lock, serialising every
  committer behind it). Rings of one channel made before the next send go out as one
  notification, and all channels pending at a send go out together
  (``SELECT pg_notify(c, '') FROM unnest($1::text[]) c``); rings made while a send is in flight
  wait for the next one, so under load a send carries more channels instead of there being
  more sends.
- A replica that knows it is alone (``alone``: its sweeps find no other live replica; a replica
  that starts rings ``REPLICAS`` so the others sweep at once) sends nothing for a commit's
  logs (``ring_all``): no other process could hear them. It wakes its own listeners of those
  channels in process instead. ``ring`` (a cancel, a delete, a lease) always goes out.
- Listening is ref-counted: the listeners of one channel share one ``LISTEN``, and the last to
  close ``UNLISTEN``s it. ``listen()`` returns at once; the ``LISTEN`` is made in the
  background, and once it is in effect every listener that was waiting for it is woken once,
  because a ring sent before then could not be heard (the follower re-reads; nothing slips
  between its first read and its first wait).
- A lost connection (a database restart, the network, ``pg_terminate_backend``) is replaced in
  the background with backoff (50 ms doubling to 1 s; a sending connection found dead at a
  send is first replaced at once, since a ring is waiting). ``connected`` is False while the
  listening connection is down, and every listener is woken when it goes down and again once
  every channel is ``LISTEN``ed anew: notifications sent meanwhile were never delivered. Rings
  made while the sending connection is down are kept, coalesced, and sent once it is back; past
  ``MAX_PENDING`` channels new ones are dropped, which is safe because followers poll.
- The listening connection is probed every ``_PROBE_S`` when idle, so a connection the network
  silently dropped is found and replaced rather than trusted for ever.

``LocalDoorbell`` keeps the same contract inside one process (SQLite and the in-memory store
serve one process): a ring wakes this process's listeners on the next loop turn, coalesced.

Channel names are response ids (``resp_`` + 48 hex), replica ids (``rep_`` + 16 hex) and
``ledger_replicas``. PostgreSQL truncates a longer ``LISTEN`` name to 63 bytes but refuses a
longer ``pg_notify`` channel, so such a name could never be heard: ``listen()`` refuses it with
``ValueError`` and ``ring()`` drops it (logged once), and both doorbells apply the same rule so
a bad name fails under SQLite too. ``ring()`` never blocks and never raises; call it (and
everything else here) from the event loop's thread.

Connections carry ``application_name`` "<name> (listen)" and "<name> (send)", so
``pg_stat_activity`` shows who is listening.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, Protocol

import asyncpg
from sqlalchemy import make_url

from persistence.health import describe, is_unavailable

#: The shortest time between two sends of one doorbell: what a ring may wait, at most, to be
#: coalesced with the next commits' (the follower lag target is 20 ms at p99).
SEND_INTERVAL_S = 0.002

__all__ = [
    "MAX_CHANNEL_BYTES",
    "MAX_PENDING",
    "Doorbell",
    "Listener",
    "LocalDoorbell",
    "PgDoorbell",
    "doorbell_for",
    "dsn_from_url",
]

_log = logging.getLogger(__name__)

#: PostgreSQL's identifier limit (NAMEDATALEN - 1); ``pg_notify`` refuses longer channels.
MAX_CHANNEL_BYTES = 63
#: Channels kept for sending while the sending connection is down; past it rings are dropped.
MAX_PENDING = 10_000

_NOTIFY = "SELECT pg_notify(c, '') FROM unnest($1::text[]) c"
_BACKOFF_MIN_S = 0.05
_BACKOFF_MAX_S = 1.0
_CONNECT_TIMEOUT_S = 5.0
_STATEMENT_TIMEOUT_S = 5.0
_PROBE_S = 10.0
_CLOSE_FLUSH_S = 1.0


class Listener:
    """One follower's view of a channel: a flag that a ring sets and ``wait`` clears.

    The flag is what makes ``read the store; if nothing new: wait`` safe: a ring that lands
    between the read and the wait is not lost, it makes the wait return at once. True from
    ``wait`` means "look again", never a promise that something changed (reconnects and new
    ``LISTEN``s wake too). One task waits on a listener; each follower takes its own."""

    def __init__(self, channel: str, on_close: Callable[[Listener], None]) -> None:
        self.channel = channel
        self._event = asyncio.Event()
        self._on_close: Callable[[Listener], None] | None = on_close

    async def wait(self, timeout: float) -> bool:
        """True at once if rung since the previous ``wait`` returned (or since ``listen()``);
        else wait up to ``timeout`` seconds for a ring: True if rung, False on timeout. The flag
        is cleared on return either way. ``timeout <= 0`` only looks at the flag."""
        if not self._event.is_set() and timeout > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._event.wait()
        rung = self._event.is_set()
        self._event.clear()
        return rung

    def close(self) -> None:
        """Stop listening (the last listener of a channel ends its ``LISTEN``); idempotent."""
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close(self)

    def _wake(self) -> None:
        self._event.set()

    def __enter__(self) -> Listener:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def __aenter__(self) -> Listener:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Doorbell(Protocol):
    """What the store and the service use; ``PgDoorbell`` and ``LocalDoorbell`` keep it."""

    #: No other replica is alive, as this one last saw (its repair loop's sweeps, and a
    #: ``REPLICAS`` ring from a replica that starts or leaves): then a commit's rings
    #: (``ring_all``) wake this process's listeners only. False until known.
    alone: bool

    def ring(self, channel: str) -> None: ...

    def ring_all(self, channels: Iterable[str]) -> None:
        """``ring`` each of ``channels`` (a commit's logs: one call a commit, not one a log);
        while ``alone``, for this process's listeners only."""
        ...

    def listen(self, channel: str) -> Listener: ...

    @property
    def connected(self) -> bool: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...


def dsn_from_url(database_url: str) -> str:
    """A plain asyncpg DSN (``postgresql://...``) for a SQLAlchemy URL such as
    ``postgresql+asyncpg://user:pw@host/db`` (the password is kept)."""
    url = make_url(database_url)
    if url.get_backend_name() not in ("postgresql", "postgres"):
        raise ValueError(f"not a PostgreSQL URL: {url.drivername!r}")
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


def doorbell_for(database_url: str) -> Doorbell:
    """``PgDoorbell`` for a PostgreSQL URL (replicas can share it), else ``LocalDoorbell``."""
    if make_url(database_url).get_backend_name() in ("postgresql", "postgres"):
        return PgDoorbell(dsn_from_url(database_url))
    return LocalDoorbell()


def _channel_problem(channel: str) -> str | None:
    """Why ``channel`` cannot be a PostgreSQL channel name, or None if it can."""
    if not channel:
        return "a channel name cannot be empty"
    if "\x00" in channel:
        return "a channel name cannot contain NUL"
    try:
        size = len(channel.encode())
    except UnicodeEncodeError:
        return "a channel name must be valid UTF-8 text"
    if size > MAX_CHANNEL_BYTES:
        return f"channel name {channel[:70]!r} is {size} bytes, over {MAX_CHANNEL_BYTES}"
    return None


class _Listeners:
    """The listeners of each channel: the ref count behind ``LISTEN``/``UNLISTEN``."""

    def __init__(self) -> None:
        self.by_channel: dict[str, set[Listener]] = {}
        self._soon: set[str] = set()
        self._scheduled = False

    def add(self, listener: Listener) -> bool:
        """Register ``listener``; True if its channel had no listener before."""
        group = self.by_channel.setdefault(listener.channel, set())
        group.add(listener)
        return len(group) == 1

    def remove(self, listener: Listener) -> bool:
        """Forget ``listener``; True if it was its channel's last."""
        group = self.by_channel.get(listener.channel)
        if group is None or listener not in group:
            return False
        group.discard(listener)
        if group:
            return False
        del self.by_channel[listener.channel]
        return True

    def wake(self, channel: str) -> None:
        for listener in self.by_channel.get(channel, ()):
            listener._wake()

    def wake_all(self) -> None:
        for group in self.by_channel.values():
            for listener in group:
                listener._wake()

    def wake_soon(self, channels: Iterable[str]) -> None:
        """Wake the listeners of ``channels`` in this process on the next loop turn, once per
        channel however often it is rung meanwhile (a channel nobody here listens to: nothing)."""
        listened = self.by_channel
        heard = [c for c in channels if c in listened]
        if heard:
            self._soon.update(heard)
            if not self._scheduled:
                self._scheduled = True
                asyncio.get_running_loop().call_soon(self._wake_soon)

    def forget_soon(self) -> None:
        """Drop the wakes not delivered yet (the doorbell closed)."""
        self._soon.clear()

    def _wake_soon(self) -> None:
        self._scheduled = False
        channels, self._soon = self._soon, set()
        for channel in channels:
            self.wake(channel)


class _Rejections:
    """Refused ring names, logged once per doorbell (a bug in the caller, not an outage)."""

    def __init__(self) -> None:
        self._logged = False

    def allowed(self, channel: str) -> bool:
        if channel.isascii() and 0 < len(channel) <= MAX_CHANNEL_BYTES and "\x00" not in channel:
            return True  # every id the ledger rings: no encoding needed to know
        problem = _channel_problem(channel)
        if problem is None:
            return True
        if not self._logged:
            self._logged = True
            _log.error("doorbell: ring dropped (logged once): %s", problem)
        return False


class LocalDoorbell:
    """The doorbell for one process: a ring wakes this process's listeners on the next loop
    turn, once per channel however often it was rung in between."""

    def __init__(self) -> None:
        self._listeners = _Listeners()
        self._rejections = _Rejections()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.alone = True  # (nobody outside this process hears it anyway)

    @property
    def connected(self) -> bool:
        return self._loop is not None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()

    async def close(self) -> None:
        self._loop = None
        self._listeners.forget_soon()

    def ring(self, channel: str) -> None:
        self.ring_all((channel,))

    def ring_all(self, channels: Iterable[str]) -> None:
        if self._loop is None:
            return
        allowed = self._rejections.allowed
        # nobody in this process listens to the others, so nobody anywhere does
        self._listeners.wake_soon([c for c in channels if allowed(c)])

    def listen(self, channel: str) -> Listener:
        problem = _channel_problem(channel)
        if problem is not None:
            raise ValueError(problem)
        listener = Listener(channel, self._forget)
        self._listeners.add(listener)
        return listener

    def _forget(self, listener: Listener) -> None:
        self._listeners.remove(listener)


class PgDoorbell:
    """The doorbell between replicas sharing one PostgreSQL (see the module docstring).

    ``dsn``: a plain asyncpg DSN (``dsn_from_url`` makes one from the store's URL).
    ``application_name``: how its two connections show in ``pg_stat_activity``."""

    def __init__(self, dsn: str, *, application_name: str = "responses-ledger doorbell") -> None:
        self._dsn = dsn
        self._name = application_name
        self._listeners = _Listeners()
        self._rejections = _Rejections()
        self._started = False
        self._closed = False
        self._tasks: list[asyncio.Task[None]] = []
        # sending
        self._pending: set[str] = set()
        self._has_pending = asyncio.Event()
        self._idle = asyncio.Event()  # nothing pending and nothing in flight
        self._idle.set()
        self._overflow_logged = False
        # listening
        self._connected = False
        self._changed = asyncio.Event()  # the set of channels with listeners changed
        self._active: set[str] = set()  # LISTENed on the current listening connection
        self._listen_connection: Any = None
        self._listen_lock = asyncio.Lock()  # asyncpg runs one operation at a time
        self.alone = False

    @property
    def connected(self) -> bool:
        """False while the listening connection is down (or not yet up): poll meanwhile."""
        return self._connected

    async def start(self) -> None:
        """Start both connections in the background; returns after the first attempt to open
        the listening one (it may have failed: ``connected`` says, and retries go on)."""
        if self._started or self._closed:
            return
        self._started = True
        first_attempt = asyncio.get_running_loop().create_future()
        self._tasks = [
            asyncio.create_task(self._listen_forever(first_attempt), name="doorbell listen"),
            asyncio.create_task(self._send_forever(), name="doorbell send"),
        ]
        await first_attempt

    async def close(self) -> None:
        """Send what is pending (for up to a second: a replica's last ring, such as releasing
        its lease, should not be lost to its own shutdown), then drop both connections."""
        if self._closed:
            return
        self._closed = True
        if self._started:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_CLOSE_FLUSH_S):
                    await self._idle.wait()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        self._pending.clear()
        self._listeners.forget_soon()
        self._connected = False

    def ring(self, channel: str) -> None:
        self._send((channel,))

    def ring_all(self, channels: Iterable[str]) -> None:
        if not self.alone:
            self._send(channels)
            return
        if not self._started or self._closed:
            return
        # No other replica to hear them (sending them cost 2 us of CPU a paced token here and
        # 0.5 in the database, bench/RESULTS.md): only this process's followers, if any.
        self._listeners.wake_soon(channels)

    def _send(self, channels: Iterable[str]) -> None:
        if not self._started or self._closed:
            return
        pending, allowed = self._pending, self._rejections.allowed
        added = False
        for channel in channels:
            if channel in pending or not allowed(channel):
                continue
            if len(pending) >= MAX_PENDING:
                if not self._overflow_logged:
                    self._overflow_logged = True
                    _log.warning(
                        "doorbell: %d channels waiting to be sent; dropping new rings until the "
                        "database takes them (followers poll meanwhile)",
                        MAX_PENDING,
                    )
                continue
            pending.add(channel)
            added = True
        if added:
            self._idle.clear()
            self._has_pending.set()

    def listen(self, channel: str) -> Listener:
        problem = _channel_problem(channel)
        if problem is not None:
            raise ValueError(problem)
        listener = Listener(channel, self._forget)
        if self._listeners.add(listener):
            self._changed.set()
        return listener

    async def listening_channels(self) -> frozenset[str]:
        """The channels the listening session has ``LISTEN``ed, as PostgreSQL itself reports
        them (``pg_listening_channels()``); empty while the connection is down."""
        async with self._listen_lock:
            connection = self._listen_connection
            if connection is None or connection.is_closed():
                return frozenset()
            rows = await connection.fetch(
                "SELECT pg_listening_channels() AS c", timeout=_STATEMENT_TIMEOUT_S
            )
        return frozenset(row["c"] for row in rows)

    def _forget(self, listener: Listener) -> None:
        if self._listeners.remove(listener):
            self._changed.set()

    def _on_notification(self, _connection: object, _pid: int, channel: str, _payload: str) -> None:
        self._listeners.wake(channel)

    async def _connect(self, role: str) -> Any:
        return await asyncpg.connect(
            self._dsn,
            timeout=_CONNECT_TIMEOUT_S,
            # a NOTIFY's transaction gets an xid, so its commit would wait for a WAL flush
            # (an fsync, stuck behind every other committer's): a ring need not be durable
            server_settings={
                "application_name": f"{self._name} ({role})",
                "synchronous_commit": "off",
            },
        )

    # -- listening -------------------------------------------------------------------------

    async def _listen_forever(self, first_attempt: asyncio.Future[None]) -> None:
        backoff = _Backoff()
        try:
            while True:
                try:
                    connection = await self._connect("listen")
                except Exception as exc:
                    _log_failure("listening connection", exc, backoff.failures)
                else:
                    await self._serve(connection, first_attempt, backoff)
                if not first_attempt.done():
                    first_attempt.set_result(None)
                await asyncio.sleep(backoff.next_s())
        finally:
            if not first_attempt.done():  # closed while starting: do not leave start() hanging
                first_attempt.set_result(None)

    async def _serve(
        self, connection: Any, first_attempt: asyncio.Future[None], backoff: _Backoff
    ) -> None:
        """Keep ``connection`` LISTENing to every channel that has listeners until it is lost."""
        lost = asyncio.get_running_loop().create_future()

        def on_lost(_connection: object) -> None:
            if not lost.done():
                lost.set_result(None)

        connection.add_termination_listener(on_lost)
        self._listen_connection = connection
        try:
            while not lost.done():
                await self._reconcile(connection)
                backoff.reset()
                if not first_attempt.done():
                    first_attempt.set_result(None)
                changed = asyncio.ensure_future(self._changed.wait())
                try:
                    done, _ = await asyncio.wait(
                        {changed, lost}, timeout=_PROBE_S, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    changed.cancel()
                if not done:
                    async with self._listen_lock:
                        await connection.fetchval("SELECT 1", timeout=_STATEMENT_TIMEOUT_S)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not lost.done() and not is_unavailable(exc):
                _log.exception("doorbell: listening connection failed; reconnecting")
        finally:
            self._listen_connection = None
            self._active.clear()
            if self._connected:
                self._connected = False
                if not self._closed:
                    _log.warning("doorbell: listening connection lost; followers poll meanwhile")
                self._listeners.wake_all()
            connection.terminate()

    async def _reconcile(self, connection: Any) -> None:
        """Make the session's LISTENs match the channels that have listeners, then wake the
        listeners of every channel newly LISTENed (they could not hear rings until now)."""
        self._changed.clear()
        newly: list[str] = []
        async with self._listen_lock:
            while True:
                wanted = set(self._listeners.by_channel)
                add, drop = wanted - self._active, self._active - wanted
                if not add and not drop:
                    break
                for channel in add:
                    await connection.add_listener(channel, self._on_notification)
                    self._active.add(channel)
                    newly.append(channel)
                for channel in drop:
                    await connection.remove_listener(channel, self._on_notification)
                    self._active.discard(channel)
        # No await from here on: ``connected`` turns True in the same step as the wake-ups.
        if not self._connected:
            self._connected = True
            _log.info("doorbell: listening (%d channels)", len(self._active))
        for channel in newly:
            self._listeners.wake(channel)

    # -- sending ---------------------------------------------------------------------------

    async def _send_forever(self) -> None:
        # A connection that died while idle (a restart, an idle timeout) is replaced at once:
        # a ring is waiting. Failing again before a send goes through backs off.
        backoff = _Backoff(immediate=True)
        connection: Any = None
        loop = asyncio.get_running_loop()
        last_send = float("-inf")
        try:
            while True:
                if connection is None:
                    try:
                        connection = await self._connect("send")
                    except Exception as exc:
                        _log_failure("sending connection", exc, backoff.failures)
                        await asyncio.sleep(backoff.next_s())
                        continue
                await self._has_pending.wait()
                # at most one send per SEND_INTERVAL_S: the rings of the commits meanwhile go
                # together (a commit a millisecond would otherwise cost a statement each)
                delay = last_send + SEND_INTERVAL_S - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                last_send = loop.time()
                self._has_pending.clear()
                channels, self._pending = self._pending, set()
                try:
                    await connection.execute(_NOTIFY, list(channels), timeout=_STATEMENT_TIMEOUT_S)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    if connection.is_closed() or is_unavailable(exc):
                        _log_failure("sending connection", exc, backoff.failures)
                        self._keep(channels)
                        connection.terminate()
                        connection = None
                        await asyncio.sleep(backoff.next_s())
                    else:  # not the database's state: retrying would fail the same way
                        _log.exception("doorbell: %d rings refused; dropped", len(channels))
                else:
                    backoff.reset()
                    self._overflow_logged = False
                if not self._pending:
                    self._idle.set()
        finally:
            if connection is not None:
                connection.terminate()

    def _keep(self, channels: set[str]) -> None:
        """Put back rings whose send failed, to go with the next send (up to ``MAX_PENDING``)."""
        room = MAX_PENDING - len(self._pending)
        for channel in channels:
            if channel in self._pending:
                continue
            if room <= 0:
                break
            self._pending.add(channel)
            room -= 1
        if self._pending:
            self._has_pending.set()


class _Backoff:
    """Delays between reconnects: 50 ms doubling to 1 s (after one immediate retry if
    ``immediate``), restarted by progress (a send that went through, a LISTEN pass that
    completed), so a flapping server is not hammered."""

    def __init__(self, *, immediate: bool = False) -> None:
        self.failures = 0
        self._immediate = immediate

    def next_s(self) -> float:
        doublings = self.failures - 1 if self._immediate else self.failures
        self.failures += 1
        if doublings < 0:
            return 0.0
        return min(_BACKOFF_MIN_S * (1 << min(doublings, 16)), _BACKOFF_MAX_S)

    def reset(self) -> None:
        self.failures = 0


def _log_failure(what: str, exc: BaseException, failures: int) -> None:
    """The first failure of an outage is a warning; the retries that follow are debug noise."""
    level = logging.WARNING if failures == 0 else logging.DEBUG
    _log.log(level, "doorbell: %s unavailable (%s); retrying", what, describe(exc))
