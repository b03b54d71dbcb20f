"""Which server process owns which live response: replicas and their leases.

Every server process is a *replica*: a random id, its host name and process id, and a row in the
``replicas`` table whose lease (``expires_at``) the repair loop renews every heartbeat (the
store's probe is that renewal: one small write, which also tells ``/health`` whether the
database takes writes). Every response a replica creates records it as ``owner``.

A response whose owner is not alive is *orphaned*: its owner was killed, or lost the database
for longer than its lease. Start-up recovery and the repair loop touch only orphaned responses,
never those of a live replica, so a server that starts beside others, or
sweeps while they stream, harms none of their responses. A replica is alive while its lease is
unexpired, except that a process on this same host that no longer exists is dead at once (a
restart after ``kill -9`` need not wait out the lease).

SQLite serves one process: a second server on the same SQLite file while the first is alive is
refused at start with a message that says so (use PostgreSQL for several replicas).

What happens to an orphan is ``app.takeover``'s (claimed by exactly one survivor, its epoch
bumped so the old owner's appends are fenced out, and continued from its log); a drain hands a
replica's responses over by releasing its lease (``app.drain``).
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Sequence

from persistence.records import Replica

__all__ = ["SingleProcessOnly", "alive", "check_single_process", "live_ids", "new_replica"]


class SingleProcessOnly(Exception):
    """Another live server uses this SQLite database."""


def new_replica(now: float | None = None) -> Replica:
    started = time.time() if now is None else now
    return Replica(
        id=f"rep_{secrets.token_hex(8)}",
        host=socket.gethostname(),
        pid=os.getpid(),
        started_at=started,
        heartbeat_at=started,
        expires_at=started,
    )


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


def alive(row: Replica, me: Replica, now: float) -> bool:
    """Whether the replica of ``row`` may still be generating its responses."""
    if row.id == me.id:
        return True
    if row.expires_at <= now:
        return False
    # a process gone from this host is dead at once: no need to wait out its lease
    return not (row.host == me.host and row.pid != me.pid and not _process_exists(row.pid))


def live_ids(rows: Sequence[Replica], me: Replica, now: float) -> list[str]:
    return [row.id for row in rows if alive(row, me, now)]


def check_single_process(rows: Sequence[Replica], me: Replica, now: float) -> None:
    """Raise ``SingleProcessOnly`` if another process is alive on this (SQLite) database.
    Servers inside this same process (tests run several) are not another process."""
    for row in rows:
        other_process = row.host != me.host or row.pid != me.pid
        if other_process and alive(row, me, now):
            raise SingleProcessOnly(
                f"another responses-ledger server (pid {row.pid} on {row.host}) is using this "
                "SQLite database; SQLite serves one server process. Stop it, or use "
                "PostgreSQL (DATABASE_URL=postgresql+asyncpg://...) to run several replicas."
            )
