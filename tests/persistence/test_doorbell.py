"""The doorbell: rings wake listeners, coalesced; LISTEN is shared; a lost connection heals.

The contract tests run against ``LocalDoorbell`` and a ``PgDoorbell`` on the real PostgreSQL
(which rings itself through the database); the rest are PostgreSQL's own: two doorbells as two
replicas, a raw asyncpg listener counting the notifications, ``pg_listening_channels()`` for the
shared LISTEN, and ``pg_terminate_backend`` for lost connections.

No assertion is about time: a wait that should be woken gets a generous bound (``_SOON``) and
fails if it times out; "not woken" is checked after a later ring has provably arrived.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack

import asyncpg
import pytest

from persistence.doorbell import (
    MAX_CHANNEL_BYTES,
    MAX_PENDING,
    Doorbell,
    Listener,
    LocalDoorbell,
    PgDoorbell,
    doorbell_for,
    dsn_from_url,
)
from tests.support.postgres import fresh_database, unavailable
from tests.support.waiting import eventually

_SOON = 5.0  # seconds: the bound on anything that should happen promptly

Start = Callable[..., Awaitable[PgDoorbell]]


def _channel() -> str:
    return f"resp_{secrets.token_hex(24)}"


@pytest.fixture(scope="module")
async def pg_dsn() -> AsyncIterator[str]:
    reason = await unavailable()
    if reason is not None:
        pytest.skip(reason)
    async with fresh_database("ledger_doorbell") as url:
        yield dsn_from_url(url)


@pytest.fixture
async def start_pg(pg_dsn: str) -> AsyncIterator[Start]:
    """Start PgDoorbells (each a "replica"), all closed at the end of the test."""
    async with AsyncExitStack() as stack:

        async def start(application_name: str = "doorbell test") -> PgDoorbell:
            doorbell = PgDoorbell(pg_dsn, application_name=application_name)
            await doorbell.start()
            stack.push_async_callback(doorbell.close)
            return doorbell

        yield start


@pytest.fixture
async def local_doorbell() -> AsyncIterator[LocalDoorbell]:
    local = LocalDoorbell()
    await local.start()
    yield local
    await local.close()


@pytest.fixture
async def pg_doorbell(start_pg: Start) -> PgDoorbell:
    return await start_pg()


@pytest.fixture(params=["local", pytest.param("pg", marks=pytest.mark.postgres)])
def doorbell(request: pytest.FixtureRequest) -> Doorbell:
    """Each doorbell in turn, started; the PostgreSQL one rings itself through the database."""
    chosen: Doorbell = request.getfixturevalue(f"{request.param}_doorbell")
    return chosen


async def _listening(doorbell: Doorbell, channel: str) -> Listener:
    """A listener whose channel can be heard: for the PostgreSQL doorbell, once its session
    reports the LISTEN (the wake the doorbell gives when that LISTEN takes effect is consumed)."""
    listener = doorbell.listen(channel)
    if isinstance(doorbell, PgDoorbell):

        async def listened() -> bool:
            return channel in await doorbell.listening_channels()

        await eventually(listened, f"LISTEN {channel}", _SOON)
        await listener.wait(0)
    return listener


# -- the contract ------------------------------------------------------------------------------


async def test_a_ring_wakes_the_listeners_of_its_channel_only(doorbell: Doorbell) -> None:
    rung, quiet = _channel(), _channel()
    first, second = await _listening(doorbell, rung), await _listening(doorbell, rung)
    other = await _listening(doorbell, quiet)

    doorbell.ring(rung)

    assert await first.wait(_SOON)
    assert await second.wait(_SOON)
    assert not await other.wait(0)


async def test_a_ring_before_the_wait_is_kept_and_the_flag_clears(doorbell: Doorbell) -> None:
    channel = _channel()
    follower, witness = await _listening(doorbell, channel), await _listening(doorbell, channel)

    doorbell.ring(channel)
    assert await witness.wait(_SOON)  # the ring has arrived; the follower was not waiting

    assert await follower.wait(0), "a ring between the read and the wait was lost"
    assert not await follower.wait(0), "the flag did not clear"
    assert not await follower.wait(0.05), "woken with nothing rung"


async def test_rings_before_delivery_wake_once(doorbell: Doorbell) -> None:
    channel, later = _channel(), _channel()
    listener, witness = await _listening(doorbell, channel), await _listening(doorbell, later)

    for _ in range(5):
        doorbell.ring(channel)
    assert await listener.wait(_SOON)
    doorbell.ring(later)
    assert await witness.wait(_SOON)  # anything the five rings sent has arrived by now

    assert not await listener.wait(0), "five rings woke the listener more than once"


async def test_a_closed_listener_is_not_woken_and_close_is_idempotent(doorbell: Doorbell) -> None:
    channel = _channel()
    closed, witness = await _listening(doorbell, channel), await _listening(doorbell, channel)
    closed.close()
    closed.close()
    with doorbell.listen(_channel()) as scoped:
        pass
    scoped.close()
    async with doorbell.listen(_channel()):
        pass

    doorbell.ring(channel)

    assert await witness.wait(_SOON)
    assert not await closed.wait(0)


async def test_channel_names_past_63_bytes_are_refused_at_listen_and_dropped_at_ring(
    doorbell: Doorbell, caplog: pytest.LogCaptureFixture
) -> None:
    longest = "c" * MAX_CHANNEL_BYTES
    for bad in ("c" * (MAX_CHANNEL_BYTES + 1), "é" * 32, ""):
        with pytest.raises(ValueError):
            doorbell.listen(bad)
    listener = await _listening(doorbell, longest)

    with caplog.at_level(logging.ERROR, logger="persistence.doorbell"):
        doorbell.ring("c" * (MAX_CHANNEL_BYTES + 1))
        doorbell.ring("é" * 32)
        doorbell.ring("nul\x00")
        doorbell.ring(longest)  # goes with the same send as the refused ones would have

    assert await listener.wait(_SOON)
    assert len(caplog.records) == 1, "a refused name is logged once per doorbell"


async def test_ring_all_wakes_the_listeners_of_each_channel_once_and_drops_bad_names(
    doorbell: Doorbell, caplog: pytest.LogCaptureFixture
) -> None:
    """What the store rings after a commit: every log it appended to, in one call."""
    first, second, quiet = _channel(), _channel(), _channel()
    a, b = await _listening(doorbell, first), await _listening(doorbell, second)
    other = await _listening(doorbell, quiet)

    with caplog.at_level(logging.ERROR, logger="persistence.doorbell"):
        doorbell.ring_all([first, _channel(), second, first, "é" * 32])

    assert await a.wait(_SOON)
    assert await b.wait(_SOON)
    doorbell.ring(quiet)
    assert await other.wait(_SOON)  # anything ring_all sent has arrived by now
    assert not await a.wait(0), "a channel named twice in one call woke its listener twice"
    assert len(caplog.records) == 1, "the refused name is logged"


async def test_listen_before_start_and_ring_around_the_lifetime() -> None:
    local = LocalDoorbell()
    channel = _channel()
    listener = local.listen(channel)
    local.ring(channel)  # before start: nothing
    assert not local.connected
    await local.start()
    assert local.connected
    assert not await listener.wait(0)
    local.ring(channel)
    assert await listener.wait(_SOON)
    await local.close()
    local.ring(channel)
    assert not local.connected
    assert not await listener.wait(0.05)


# -- PostgreSQL: between replicas --------------------------------------------------------------


@pytest.mark.postgres
async def test_a_ring_on_one_replica_wakes_a_listener_on_another(start_pg: Start) -> None:
    owner, follower_replica = await start_pg("replica a"), await start_pg("replica b")
    channel = _channel()
    listener = await _listening(follower_replica, channel)

    owner.ring(channel)

    assert await listener.wait(_SOON)
    assert not await listener.wait(0)


@pytest.mark.postgres
async def test_ring_all_on_one_replica_wakes_listeners_on_another(start_pg: Start) -> None:
    owner, follower_replica = await start_pg("replica a"), await start_pg("replica b")
    channels = [_channel() for _ in range(3)]
    listeners = [await _listening(follower_replica, channel) for channel in channels]

    owner.ring_all(channels)

    for listener in listeners:
        assert await listener.wait(_SOON)
        assert not await listener.wait(0)


@pytest.mark.postgres
async def test_alone_a_commits_rings_wake_this_process_only_and_a_plain_ring_still_goes_out(
    pg_dsn: str, start_pg: Start
) -> None:
    """A replica that knows no other is alive sends nothing for its commits' logs (nobody else
    could hear it), yet its own followers wake; ``ring`` (a cancel, a delete, a lease) always
    goes out. Another session LISTENs to every channel to see what reaches the database."""
    owner = await start_pg("alone")
    local_channel, quiet, sentinel = _channel(), _channel(), _channel()
    local = await _listening(owner, local_channel)
    heard: list[str] = []
    arrived = asyncio.Event()

    def hear(_connection: object, _pid: int, channel: str, _payload: str) -> None:
        heard.append(channel)
        if channel == sentinel:
            arrived.set()

    raw = await asyncpg.connect(pg_dsn)
    try:
        for name in (local_channel, quiet, sentinel):
            await raw.add_listener(name, hear)
        owner.alone = True
        owner.ring_all([local_channel, quiet])
        assert await local.wait(_SOON)  # this process's follower woke
        assert not await local.wait(0)
        owner.ring(sentinel)  # sent; notifications arrive in order, so anything before it is in
        await asyncio.wait_for(arrived.wait(), _SOON)
        assert heard == [sentinel]

        owner.alone = False  # another replica appeared: the commits' rings go out again
        owner.ring_all([quiet])
        await eventually(lambda: quiet in heard, "the commit's ring", _SOON)
        assert heard == [sentinel, quiet]
    finally:
        await raw.close()


@pytest.mark.postgres
async def test_a_ring_just_before_close_is_still_sent(pg_dsn: str, start_pg: Start) -> None:
    """A replica's last ring (releasing its lease) must not be lost to its own shutdown."""
    replica = await start_pg()
    channel = _channel()
    listener = await _listening(replica, channel)
    leaving = PgDoorbell(pg_dsn)
    await leaving.start()

    leaving.ring(channel)
    await leaving.close()

    assert await listener.wait(_SOON)


@pytest.mark.postgres
async def test_listen_before_start_hears_rings_once_started(pg_dsn: str, start_pg: Start) -> None:
    owner = await start_pg()
    late = PgDoorbell(pg_dsn)
    channel = _channel()
    listener = late.listen(channel)
    late.ring(channel)  # before start: a no-op, not an error
    assert not late.connected
    try:
        await late.start()
        assert late.connected
        assert await listener.wait(_SOON)  # its LISTEN took effect
        owner.ring(channel)
        assert await listener.wait(_SOON)
    finally:
        await late.close()
    assert not late.connected
    late.ring(channel)  # after close: a no-op


@pytest.mark.postgres
async def test_rings_before_a_send_go_out_as_one_notification_per_channel(
    pg_dsn: str, start_pg: Start
) -> None:
    owner = await start_pg()
    channels, sentinel = [_channel() for _ in range(3)], _channel()
    counts = dict.fromkeys([*channels, sentinel], 0)
    arrived = {name: asyncio.Event() for name in [*channels, sentinel]}

    def count(_connection: object, _pid: int, channel: str, payload: str) -> None:
        assert payload == ""
        counts[channel] += 1
        arrived[channel].set()

    raw = await asyncpg.connect(pg_dsn)
    try:
        for name in [*channels, sentinel]:
            await raw.add_listener(name, count)
        for _ in range(4):
            for name in channels:
                owner.ring(name)
        for name in channels:
            await asyncio.wait_for(arrived[name].wait(), _SOON)
        owner.ring(sentinel)
        await asyncio.wait_for(arrived[sentinel].wait(), _SOON)
    finally:
        await raw.close()

    # Notifications arrive in commit order: any second NOTIFY would have preceded the sentinel.
    assert counts == dict.fromkeys([*channels, sentinel], 1)


@pytest.mark.postgres
async def test_listeners_of_one_channel_share_one_listen_until_the_last_closes(
    start_pg: Start,
) -> None:
    owner, replica = await start_pg(), await start_pg()
    channel = _channel()
    first = await _listening(replica, channel)
    second = replica.listen(channel)
    assert not await second.wait(0), "joining a LISTEN already in effect needs no wake"
    assert await replica.listening_channels() == {channel}

    first.close()
    owner.ring(channel)
    assert await second.wait(_SOON), "closing one of two listeners ended the shared LISTEN"
    assert await replica.listening_channels() == {channel}

    second.close()

    async def unlistened() -> bool:
        return await replica.listening_channels() == frozenset()

    await eventually(unlistened, "UNLISTEN after the last listener closed", _SOON)
    again = await _listening(replica, channel)
    owner.ring(channel)
    assert await again.wait(_SOON)


# -- PostgreSQL: lost connections --------------------------------------------------------------


async def _backend(admin: asyncpg.Connection, application_name: str) -> int:
    pid = await admin.fetchval(
        "SELECT pid FROM pg_stat_activity WHERE application_name = $1", application_name
    )
    assert isinstance(pid, int), f"no backend named {application_name!r}"
    return pid


async def _terminate(admin: asyncpg.Connection, pid: int) -> None:
    assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)

    async def gone() -> bool:
        still = await admin.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid)
        return bool(still == 0)

    await eventually(gone, f"backend {pid} to end", _SOON)


@pytest.mark.postgres
async def test_a_lost_listening_connection_reconnects_and_wakes_every_listener(
    pg_dsn: str, start_pg: Start
) -> None:
    name = f"doorbell {secrets.token_hex(4)}"
    owner, replica = await start_pg(), await start_pg(name)
    channels = [_channel(), _channel()]
    listeners = [await _listening(replica, channel) for channel in channels]
    assert replica.connected

    admin = await asyncpg.connect(pg_dsn)
    try:
        before = await _backend(admin, f"{name} (listen)")
        await _terminate(admin, before)
        await eventually(lambda: not replica.connected, "connected to turn False", _SOON)
        # Going down wakes every listener too (rings may be missed from here on)...
        for listener in listeners:
            assert await listener.wait(0)
        assert not replica.connected  # ...so the wake checked next can only be the reconnect's

        await eventually(lambda: replica.connected, "connected to turn True again", _SOON)
        for listener in listeners:
            assert await listener.wait(0), "not woken after the reconnect"
        assert await _backend(admin, f"{name} (listen)") != before
        assert await replica.listening_channels() == set(channels)
    finally:
        await admin.close()

    owner.ring(channels[0])
    assert await listeners[0].wait(_SOON)
    assert not await listeners[1].wait(0)


@pytest.mark.postgres
async def test_a_ring_whose_send_fails_is_sent_after_reconnecting(
    pg_dsn: str, start_pg: Start
) -> None:
    name = f"doorbell {secrets.token_hex(4)}"
    owner, replica = await start_pg(name), await start_pg()
    channel = _channel()
    listener = await _listening(replica, channel)

    admin = await asyncpg.connect(pg_dsn)
    try:
        await _terminate(admin, await _backend(admin, f"{name} (send)"))
    finally:
        await admin.close()
    owner.ring(channel)  # meets the dead connection first

    assert await listener.wait(_SOON)


async def test_an_unreachable_database_keeps_rings_up_to_the_bound_and_never_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    doorbell = PgDoorbell("postgresql://postgres@127.0.0.1:1/nowhere")
    with caplog.at_level(logging.WARNING, logger="persistence.doorbell"):
        await doorbell.start()
        assert not doorbell.connected
        listener = doorbell.listen(_channel())
        for n in range(MAX_PENDING + 10):
            doorbell.ring(f"rep_{n:016x}")
        assert not await listener.wait(0.05)  # a listener still works as a poll timer
        await doorbell.close()  # gives up flushing instead of hanging
    overflow = [r for r in caplog.records if "dropping new rings" in r.getMessage()]
    assert len(overflow) == 1


# -- URLs --------------------------------------------------------------------------------------


def test_dsn_from_url_drops_the_driver_and_keeps_the_password() -> None:
    assert (
        dsn_from_url("postgresql+asyncpg://u:s3cret@db.example:5433/ledger")
        == "postgresql://u:s3cret@db.example:5433/ledger"
    )
    assert dsn_from_url("postgresql://u@h/d") == "postgresql://u@h/d"
    with pytest.raises(ValueError):
        dsn_from_url("sqlite+aiosqlite:///ledger.db")


def test_doorbell_for_picks_postgres_only_for_postgres_urls() -> None:
    assert isinstance(doorbell_for("postgresql+asyncpg://u@h/d"), PgDoorbell)
    assert isinstance(doorbell_for("sqlite+aiosqlite:///./data/responses.db"), LocalDoorbell)
