"""The fault scenarios of issue 14, each run against a real ``responses-ledger serve`` process.

Every scenario starts a server (scripted engine: a completion of about 300 tokens at 15 ms a
token, so a stream lasts several seconds), opens ``streams`` live streams, breaks the store
mid-stream, mends it, and returns what it observed: the :class:`~tests.faults.outcomes.Figures`
of :func:`~tests.faults.outcomes.settle` plus what the scenario probed on the way (``/health``
during and after, a POST during the outage, new POSTs after it). The tests
(``tests/faults/test_*.py``) assert on it; ``bench/faults.py`` runs the same scenarios with more
streams and prints the figures. Nothing here asserts, so the benchmark can report a broken run.

The server gets small values of the store-fault settings through its environment (the shared
contract of issue 14): ``RESPONSES_LEDGER_STORE_RETRY_S`` (how long a failed commit is retried),
``RESPONSES_LEDGER_STATEMENT_TIMEOUT_S`` and ``RESPONSES_LEDGER_REPAIR_INTERVAL_S``.

Only the streams' responses take the long scripted turns; every later request (POSTs during
and after the fault) gets the scripted engine's echo, which is immediate.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.faults.outcomes import (
    TERMINAL_STATUSES,
    Figures,
    LiveStream,
    join_all,
    settle,
    start_streams,
)
from tests.faults.storage import Tmpfs, WriteLock
from tests.support.pg_cluster import PgCluster
from tests.support.process import ServerDidNotStart, ServerProcess

__all__ = [
    "BODY",
    "MODEL",
    "Degraded",
    "Outage",
    "Poisoned",
    "degraded_start",
    "fault_env",
    "outage",
    "pg_freeze",
    "pg_restart",
    "pg_stop",
    "poisoned",
    "sqlite_full",
    "sqlite_lock",
]

MODEL = "gpt-oss-faults"
WORDS = " ".join(f"word{i}" for i in range(150))  # about 300 tokens
TOKEN_DELAY_MS = 15
BODY: Mapping[str, Any] = {"model": MODEL, "input": "go"}
#: Slack on every bound that involves the server noticing a fault (2 shared cores).
SLACK_S = 10.0
#: SQLite's busy timeout in the server (a writer waits this long for a lock before failing).
SQLITE_BUSY_S = 5.0


def _final(text: str) -> str:
    return f"<|channel|>final<|message|>{text}<|return|>"


LONG_TURN = {"completion": _final(WORDS), "token_delay_ms": TOKEN_DELAY_MS}
SHORT_TURN = {"completion": _final("Stored before the fault.")}


def fault_env(
    retry_s: float, statement_timeout_s: float = 2.0, repair_interval_s: float = 0.25
) -> dict[str, str]:
    return {
        "RESPONSES_LEDGER_STORE_RETRY_S": str(retry_s),
        "RESPONSES_LEDGER_STATEMENT_TIMEOUT_S": str(statement_timeout_s),
        "RESPONSES_LEDGER_REPAIR_INTERVAL_S": str(repair_interval_s),
    }


@contextlib.contextmanager
def _server(
    workdir: Path,
    name: str,
    url: str,
    script: Mapping[str, Any],
    env: Mapping[str, str],
    ready: str = "healthy",
) -> Iterator[ServerProcess]:
    server = ServerProcess(workdir, name, url, script, model=MODEL, env=env, ready=ready)
    try:
        yield server
    finally:
        server.stop(grace_s=10)


def _mid_stream(streams: list[LiveStream], deltas: int = 5, timeout_s: float = 60) -> None:
    """Wait until every stream is under way (``deltas`` text deltas each), or has ended."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(s.deltas >= deltas or not s.is_alive() for s in streams):
            return
        time.sleep(0.02)


@dataclass
class Probe:
    status: int | None
    body: Any
    headers: Mapping[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    def describe(self) -> str:
        return f"{self.status} {self.body!r:.300} headers={dict(self.headers)}"


def _request(method: str, url: str, timeout_s: float, **kwargs: Any) -> Probe:
    start = time.monotonic()
    try:
        r = httpx.request(method, url, timeout=timeout_s, **kwargs)
    except httpx.HTTPError as exc:
        return Probe(None, f"{type(exc).__name__}: {exc}", {}, time.monotonic() - start)
    try:
        body: Any = r.json()
    except ValueError:
        body = r.text
    return Probe(r.status_code, body, dict(r.headers), time.monotonic() - start)


def health_until(base_url: str, status: int, within_s: float) -> Probe:
    """Poll ``/health`` until it answers ``status``; the last answer (and how long it took)."""
    start = time.monotonic()
    while True:
        probe = _request("GET", base_url + "/health", timeout_s=5)
        probe.seconds = time.monotonic() - start
        if probe.status == status or probe.seconds > within_s:
            return probe
        time.sleep(0.1)


def post_once(base_url: str, timeout_s: float = 60, **extra: Any) -> Probe:
    return _request(
        "POST", base_url + "/v1/responses", timeout_s, json={**BODY, "input": "hi", **extra}
    )


def new_posts(base_url: str, n: int) -> list[str]:
    """``n`` POSTs one after another: ``"200 completed"`` for each that worked."""
    out = []
    for _ in range(n):
        probe = post_once(base_url, timeout_s=30)
        status = probe.body.get("status") if isinstance(probe.body, dict) else None
        out.append(f"{probe.status} {status}" if probe.status == 200 else probe.describe())
    return out


@dataclass
class Outage:
    """What an outage scenario observed."""

    name: str
    figures: Figures
    #: seconds from the fault's start until the last stream ended (None: some never did)
    streams_ended_s: float | None = None
    #: /health once the streams had ended, while the store was still down
    health_during: Probe | None = None
    #: a POST while the store was down
    post_during: Probe | None = None
    #: a DELETE of a stream's response while the store was down (when asked for)
    delete_during: Probe | None = None
    #: a resumer opened while the store was down: how it ended
    resume_during: str | None = None
    #: /health after the fault ended (its ``seconds``: how long until 200)
    health_after: Probe | None = None
    #: POSTs after the store was back
    posts_after: list[str] = field(default_factory=list)
    server_alive: bool = True
    server_log: str = ""

    def summary(self) -> str:
        lines = [f"[{self.name}] " + self.figures.summary()]
        lines.append(f"streams ended {self.streams_ended_s} s after the fault started")
        for label, probe in (
            ("health during", self.health_during),
            ("POST during", self.post_during),
            ("DELETE during", self.delete_during),
            ("health after", self.health_after),
        ):
            if probe is not None:
                lines.append(f"{label}: {probe.describe()} after {probe.seconds:.1f} s")
        if self.resume_during is not None:
            lines.append(f"resume during the outage: {self.resume_during}")
        if self.posts_after:
            lines.append(f"POSTs after: {self.posts_after}")
        lines.append(f"server alive: {self.server_alive}")
        lines.append("server log (tail):\n" + "\n".join(self.server_log.splitlines()[-30:]))
        return "\n".join(lines)


def outage(
    name: str,
    workdir: Path,
    url: str,
    *,
    streams: int,
    env: Mapping[str, str],
    inject: Callable[[], None],
    end: Callable[[], None],
    streams_end_within_s: float,
    probes: bool = True,
    delete_probe: bool = False,
    posts_after: int = 4,
) -> Outage:
    """The common shape: streams under way; ``inject()``; wait (at most
    ``streams_end_within_s``) for every stream to end; probe health, a POST and a resumer while
    the store is still down; ``end()``; health back, every response terminal, new POSTs."""
    script = {"turns": [LONG_TURN] * streams}
    with _server(workdir, name, url, script, env) as server:
        live = start_streams(server.base_url, BODY, streams)
        _mid_stream(live)
        resumer: LiveStream | None = None
        result = Outage(name, Figures())
        fault_at = time.monotonic()
        try:
            inject()
            join_all(live, streams_end_within_s)
            if not any(s.is_alive() for s in live):
                result.streams_ended_s = max(s.ended_at or 0 for s in live) - fault_at
            if probes:
                result.health_during = health_until(server.base_url, 503, within_s=SLACK_S)
                result.post_during = post_once(server.base_url, timeout_s=20)
                target = next((s for s in live if s.response_id and s.ending == "error"), None)
                if delete_probe and target is not None:
                    result.delete_during = _request(
                        "DELETE", f"{server.base_url}/v1/responses/{target.response_id}", 20
                    )
                if target is not None and target.response_id is not None:
                    resumer = LiveStream.resume(
                        server.base_url, target.response_id, target.last_seq
                    )
                    resumer.start()
                    time.sleep(0.5)
        finally:
            end()
            fault_ended_at = time.monotonic()
        if probes:
            result.health_after = health_until(server.base_url, 200, within_s=30)
        result.figures = settle(server.base_url, live, fault_ended_at=fault_ended_at)
        if resumer is not None:
            resumer.join(max(1.0, fault_ended_at + 30 - time.monotonic()))
            result.resume_during = (
                resumer.ending if not resumer.is_alive() else "still open 30 s after"
            )
        if posts_after:
            result.posts_after = new_posts(server.base_url, posts_after)
        result.server_alive = server.alive
        result.server_log = server.log_text()
        return result


# -- PostgreSQL ------------------------------------------------------------------------------


def pg_restart(
    cluster: PgCluster, workdir: Path, *, streams: int, retry_s: float, downtime_s: float
) -> Outage:
    """A fast restart mid-stream (down ``downtime_s`` plus the start-up), no probes: with
    ``retry_s`` longer than that every stream completes; shorter, they end with ``error``."""
    cluster.reset_database()

    def restart() -> None:
        cluster.restart("fast", downtime_s=downtime_s)

    return outage(
        f"pg-restart-retry-{retry_s:g}s",
        workdir,
        cluster.url,
        streams=streams,
        env=fault_env(retry_s),
        inject=restart,
        end=lambda: None,
        streams_end_within_s=downtime_s + retry_s + 2 + SLACK_S + 10,
        probes=False,
        posts_after=2,
    )


def pg_stop(cluster: PgCluster, workdir: Path, *, streams: int, retry_s: float = 1.5) -> Outage:
    """Stopped for longer than the retry time (until every stream ended and the probes ran)."""
    cluster.reset_database()
    env = fault_env(retry_s)
    return outage(
        "pg-stop",
        workdir,
        cluster.url,
        streams=streams,
        env=env,
        inject=lambda: cluster.stop("fast"),
        end=cluster.start,
        streams_end_within_s=retry_s + 2 + SLACK_S,
        delete_probe=True,
    )


def pg_freeze(
    cluster: PgCluster,
    workdir: Path,
    *,
    streams: int,
    retry_s: float = 1.5,
    statement_timeout_s: float = 2.0,
) -> Outage:
    """SIGSTOP for longer than statement timeout + retry time, then SIGCONT."""
    cluster.reset_database()
    env = fault_env(retry_s, statement_timeout_s)
    return outage(
        "pg-freeze",
        workdir,
        cluster.url,
        streams=streams,
        env=env,
        inject=cluster.freeze,
        end=cluster.thaw,
        streams_end_within_s=statement_timeout_s + retry_s + SLACK_S,
    )


# -- SQLite ----------------------------------------------------------------------------------


def sqlite_full(disk: Tmpfs, workdir: Path, *, streams: int, retry_s: float = 1.5) -> Outage:
    """The disk fills up mid-stream (a filler file takes every free byte), then is freed; 16
    new POSTs afterwards (before the fix, 13 of 16 still got 500)."""
    url = f"sqlite+aiosqlite:///{disk.path / 'responses.db'}"
    return outage(
        "sqlite-full",
        workdir,
        url,
        streams=streams,
        env=fault_env(retry_s),
        inject=disk.fill,
        end=disk.free,
        streams_end_within_s=retry_s + 2 + SLACK_S,
        posts_after=16,
    )


def sqlite_lock(workdir: Path, *, streams: int, retry_s: float = 1.5) -> Outage:
    """Another process holds the write lock (BEGIN IMMEDIATE) past busy timeout + retry time."""
    db = workdir / "locked.db"
    url = f"sqlite+aiosqlite:///{db}"
    holder: list[WriteLock] = []

    def release() -> None:
        for lock in holder:
            lock.release()

    return outage(
        "sqlite-lock",
        workdir,
        url,
        streams=streams,
        env=fault_env(retry_s),
        inject=lambda: holder.append(WriteLock(db)),
        end=release,
        streams_end_within_s=SQLITE_BUSY_S + retry_s + 2 + SLACK_S,
    )


@dataclass
class Degraded:
    """What a start on a read-only or full SQLite database observed."""

    mode: str
    started: bool = False
    exit_code: int | None = None
    health: Probe | None = None
    get_stored: Probe | None = None
    post: Probe | None = None
    alive_after_probes: bool = False
    health_after: Probe | None = None
    posts_after: list[str] = field(default_factory=list)
    #: the response a killed process left in progress: its status once the store was writable
    left_in_progress: str | None = None
    closed_after_s: float | None = None
    server_log: str = ""

    def summary(self) -> str:
        parts = [f"[degraded start, {self.mode}] started={self.started} exit={self.exit_code}"]
        for label, probe in (
            ("health", self.health),
            ("GET stored", self.get_stored),
            ("POST", self.post),
            ("health after", self.health_after),
        ):
            if probe is not None:
                parts.append(f"{label}: {probe.describe()} after {probe.seconds:.1f} s")
        parts.append(f"alive after the probes: {self.alive_after_probes}")
        parts.append(f"POSTs after: {self.posts_after}")
        parts.append(f"left in progress: {self.left_in_progress} after {self.closed_after_s} s")
        parts.append("server log (tail):\n" + "\n".join(self.server_log.splitlines()[-30:]))
        return "\n".join(parts)


def degraded_start(disk: Tmpfs, workdir: Path, mode: str) -> Degraded:
    """A first process stores a completed response and is killed (SIGKILL) mid-way through a
    second; the disk is made read-only (``mode="readonly"``) or full (``"full"``); a second
    process starts on it, is probed, then the disk is mended."""
    if mode not in ("readonly", "full"):
        raise ValueError(mode)
    url = f"sqlite+aiosqlite:///{disk.path / 'responses.db'}"
    env = fault_env(1.5)
    result = Degraded(mode)
    with _server(workdir, f"{mode}-first", url, {"turns": [SHORT_TURN, LONG_TURN]}, env) as first:
        stored = post_once(first.base_url)
        assert stored.status == 200 and isinstance(stored.body, dict), stored.describe()
        stored_id = stored.body["id"]
        started = post_once(first.base_url, background=True)
        assert started.status == 200 and isinstance(started.body, dict), started.describe()
        open_id = started.body["id"]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            log = _request("GET", f"{first.base_url}/v1/responses/{open_id}/events", 10).body
            if (
                isinstance(log, dict)
                and sum(e["type"].endswith(".delta") for e in log["data"]) >= 3
            ):
                break
            time.sleep(0.05)
        first.kill()
    # Full: SQLite writes a checkpointed WAL again from its start, in the file's own space, so a
    # full disk still takes small commits while the WAL has such room (and then the database is
    # writable, and served as such). Full here means no room there either: the WAL is emptied
    # into the database file (nothing is lost) and truncated before the disk fills. That
    # connection stays open to the end, as the killed process's would have: the last one to
    # close removes the -wal and -shm files, which a process starting on a full disk could not
    # make again.
    holder: sqlite3.Connection | None = None
    if mode == "readonly":
        disk.readonly()
    else:
        holder = sqlite3.connect(disk.path / "responses.db")
        assert holder.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
        disk.fill()
    mended = False
    try:
        try:
            second = ServerProcess(
                workdir,
                f"{mode}-second",
                url,
                {"turns": []},
                model=MODEL,
                env=env,
                ready="listening",
            )
        except ServerDidNotStart as exc:  # it exited (before the fix: code 3) or never listened
            result.exit_code = exc.returncode
            result.server_log = str(exc)
            return result
        try:
            result.started = True
            result.health = health_until(second.base_url, 503, within_s=5)
            result.get_stored = _request("GET", f"{second.base_url}/v1/responses/{stored_id}", 10)
            result.post = post_once(second.base_url, timeout_s=30)
            time.sleep(1.0)
            result.alive_after_probes = second.alive
            if mode == "readonly":
                disk.writable()
            else:
                disk.free()
            mended = True
            mended_at = time.monotonic()
            result.health_after = health_until(second.base_url, 200, within_s=30)
            while time.monotonic() < mended_at + 30:
                probe = _request("GET", f"{second.base_url}/v1/responses/{open_id}", 10)
                if isinstance(probe.body, dict):
                    result.left_in_progress = str(probe.body.get("status"))
                    if result.left_in_progress in TERMINAL_STATUSES:
                        result.closed_after_s = time.monotonic() - mended_at
                        break
                time.sleep(0.2)
            result.posts_after = new_posts(second.base_url, 4)
        finally:
            result.exit_code = second.returncode
            second.stop(grace_s=10)
            result.server_log = second.log_text()
    finally:
        if not mended:
            if mode == "readonly":
                disk.writable()
            else:
                disk.free()
        if holder is not None:
            holder.close()
    return result


# -- a poisoned request among live streams ----------------------------------------------------

#: Bodies that carry a lone surrogate (``\udfff`` as a JSON escape, so the raw body is valid
#: JSON and valid UTF-8): (where it is, the param a 400 should name, the raw body).
POISONS: tuple[tuple[str, str, bytes], ...] = (
    (
        "metadata",
        "metadata",
        b'{"model": "%s", "input": "hi", "stream": true, "metadata": {"k": "\\udfff"}}',
    ),
    ("unknown field", "x_poison", b'{"model": "%s", "input": "hi", "x_poison": "a\\udfffb"}'),
    (
        "input message",
        "input",
        b'{"model": "%s", "background": true, "input": [{"role": "user", "type": "message",'
        b' "content": [{"type": "input_text", "text": "a\\udfffb"}]}]}',
    ),
)


@dataclass
class Poisoned:
    figures: Figures
    rounds: int
    #: (where, expected param, status, body) per poisoned POST
    answers: list[tuple[str, str, int | None, Any]] = field(default_factory=list)
    server_alive: bool = True
    server_log: str = ""

    def summary(self) -> str:
        lines = ["[poisoned] " + self.figures.summary()]
        lines.extend(f"{where}: {status} {body!r:.300}" for where, _, status, body in self.answers)
        lines.append("server log (tail):\n" + "\n".join(self.server_log.splitlines()[-30:]))
        return "\n".join(lines)


def poisoned(workdir: Path, url: str, *, streams: int = 24, rounds: int = 3) -> Poisoned:
    """While ``streams`` streams run, POST each of :data:`POISONS` ``rounds`` times; then let
    the streams end."""
    script = {"turns": [LONG_TURN] * streams}
    with _server(workdir, "poisoned", url, script, fault_env(1.5)) as server:
        live = start_streams(server.base_url, BODY, streams)
        _mid_stream(live, deltas=3)
        answers: list[tuple[str, str, int | None, Any]] = []

        def send(where: str, param: str, raw: bytes) -> None:
            body = raw.replace(b"%s", MODEL.encode())
            json.loads(body)  # valid JSON: the surrogate is an escape, not a raw byte
            probe = _request(
                "POST",
                server.base_url + "/v1/responses",
                30,
                content=body,
                headers={"content-type": "application/json"},
            )
            answers.append((where, param, probe.status, probe.body))

        # Several rounds, so that some poisoned write is likely to share a group commit with
        # the streams' deltas (they commit every token step).
        senders = []
        for _ in range(rounds):
            for poison in POISONS:
                sender = threading.Thread(target=send, args=poison)
                sender.start()
                senders.append(sender)
            time.sleep(0.3)
        for sender in senders:
            sender.join(60)
        figures = settle(server.base_url, live, fault_ended_at=time.monotonic())
        order = [where for where, _, _ in POISONS]
        answers.sort(key=lambda a: order.index(a[0]))
        return Poisoned(figures, rounds, answers, server.alive, server.log_text())
