"""What a paced token costs SQLite's writer, by the pages its commit writes: a reproduction.

Usage: ``python -m bench.sqlite_pages [--logs 256] [--steps 200] [--history 2000]
[--responses 0] [--moves 25,50] [--reps 2] [--churn COMMITS]``.

At 256 paced streams every commit appends one event to each of 256 live logs. The ledger's
``response_events`` is a rowid table (its rows fill a few pages at the end, migration 0010) with
the key ``(response_id, seq)`` as an index, and in that index each live log's newest entries sit
on a leaf page of their own: a commit dirties one index page a live log, and SQLite's WAL writes
every dirty page whole (one ``pwrite`` a page, its checksum, its wal-index entry). Counted in
the ledger (``bench.paced_path``, SQLite, 256 streams): ~1 ``pwrite`` a token, and the writer
thread's ``COMMIT`` alone ~17 µs of CPU a token, on the server's one core.

This script measures that cost outside the server, with the ledger's columns and SQLite
settings (WAL, ``synchronous = FULL``, a 64 MiB cache, foreign keys on, a passive checkpoint
every 50 commits), for these layouts:

- **indexed**: each commit's events go straight into the table with the key index;
- **indexed + foreign key**: the same, the table with the ledger's foreign key to ``responses``
  too (every inserted event looks its response up; ``responses`` holds a row for each log, and
  ``--responses`` more): the ledger's layout. The key is what stops a response deleted by hand
  mid-stream from gaining events (the writer keeps its logs' tails in memory), so "indexed"
  measures only what it costs;
- **tail + move every K**: each commit appends to an unindexed table (``tail``), and every K
  commits one transaction moves its rows into the indexed table in key order and empties it,
  so each live log's index page is written once every K commits instead of every commit;
- **keyed tail + move every K**: the same with the key on the tail too, as reads of a live log
  would need (the tail's index is small: its live logs' entries share a few pages).

Printed per layout: process CPU per event (this thread does all of it: the statements, the
commit, the WAL writes' system calls), WAL frames written per event (summed from the
checkpoints' frame counts), each commit's wall time (p50 / p99), and each move's (median /
max): a move is a stall for every stream whose commit waits behind it. The tail layouts are a
design sketch, not the ledger's: reads of a live log would have to look in both tables
(bench/RESULTS.md, fifteenth and seventeenth sessions).

``--churn COMMITS`` measures a steadier load instead (``run_churn``): responses finishing and
starting one by one, the ledger's layout against a queue that each response's last commit
copies into the indexed table (no move of everything at once, so no stall).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

__all__ = ["main", "run_layout"]

_COLUMNS = (
    "response_id TEXT NOT NULL, seq INTEGER NOT NULL, type TEXT NOT NULL, payload TEXT NOT NULL,"
    " recorded_at REAL NOT NULL, token_ids BLOB"
)
_PAYLOAD = (
    '{"type":"response.output_text.delta","sequence_number":%d,"item_id":"msg_%s",'
    '"output_index":0,"content_index":0,"delta":" word","logprobs":[]}'
)
#: A passive checkpoint every this many commits (the ledger's checkpointer: every 0.5 s).
_CHECKPOINT_EVERY = 50


_FOREIGN_KEY = ", FOREIGN KEY (response_id) REFERENCES responses (id) ON DELETE CASCADE"
#: A ``responses`` row's size here: about a stored request's.
_REQUEST = '{"model":"gpt-oss-20b","input":"%s","stream":true}' % ("x" * 400)


def _open(path: str, *, foreign_key: bool) -> sqlite3.Connection:
    con = sqlite3.connect(path, isolation_level=None)
    for pragma in (
        "PRAGMA journal_mode = WAL",
        "PRAGMA synchronous = FULL",
        "PRAGMA cache_size = -65536",
        "PRAGMA wal_autocheckpoint = 100000",
        "PRAGMA foreign_keys = ON",
    ):
        con.execute(pragma)
    con.execute(
        "CREATE TABLE responses (id TEXT PRIMARY KEY, status TEXT NOT NULL, request TEXT NOT NULL)"
    )
    key = _FOREIGN_KEY if foreign_key else ""
    con.execute(f"CREATE TABLE events ({_COLUMNS}, PRIMARY KEY (response_id, seq){key})")
    con.execute(f"CREATE TABLE tail ({_COLUMNS})")
    con.execute(f"CREATE TABLE keyed_tail ({_COLUMNS}, PRIMARY KEY (response_id, seq))")
    return con


def _store_responses(con: sqlite3.Connection, ids: list[str], status: str) -> None:
    con.execute("BEGIN")
    con.executemany(
        "INSERT INTO responses VALUES (?, ?, ?)", [(rid, status, _REQUEST) for rid in ids]
    )
    con.execute("COMMIT")


def _frames(con: sqlite3.Connection) -> int:
    """Checkpoint (passive); the WAL's frames at that moment."""
    _busy, log, _done = con.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    return max(int(log), 0)


def _store_history(con: sqlite3.Connection, logs: int, events: int, *, bare: int = 0) -> None:
    """``logs`` finished responses of ``events`` events each (so the index is not a toy), and
    ``bare`` finished responses rows without events; then a checkpoint that empties the WAL."""
    finished = [f"resp_{secrets.token_hex(24)}" for _ in range(logs + bare)]
    _store_responses(con, finished, "completed")
    con.execute("BEGIN")
    con.executemany(
        "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?)",
        (
            (rid, seq, "t", _PAYLOAD % (seq, "x"), 0.0, None)
            for rid in finished[:logs]
            for seq in range(events)
        ),
    )
    con.execute("COMMIT")
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def _live_event(rid: str, seq: int, now: float) -> tuple[Any, ...]:
    """A live log's event row, as a paced token's delta is stored."""
    return (
        rid,
        seq,
        "response.output_text.delta",
        _PAYLOAD % (seq, rid[5:21]),
        now,
        b"\x01\x02\x03\x04",
    )


def _figures(cpu: float, events: int, frames: int, commits: list[float]) -> dict[str, float]:
    """A run's figures: CPU and WAL frames an event, each commit's wall time."""
    commits = sorted(commits)
    return {
        "us_per_event": cpu / events * 1e6,
        "frames_per_event": frames / events,
        "commit_p50_ms": commits[len(commits) // 2] * 1e3,
        "commit_p99_ms": commits[min(len(commits) - 1, len(commits) * 99 // 100)] * 1e3,
        "commit_max_ms": commits[-1] * 1e3,
    }


def run_layout(
    logs: int,
    steps: int,
    history: int,
    move_every: int | None,
    *,
    foreign_key: bool = False,
    responses: int = 0,
    keyed_tail: bool = False,
) -> dict[str, float]:
    """One run: ``history`` finished logs of ``steps`` events first (so the index is not a
    toy), then ``steps`` commits of one event for each of ``logs`` live logs. ``move_every``:
    None for the indexed layouts, else K of the tail layout; ``foreign_key``: the events' table
    has one (``responses`` holds a row for every log, and ``responses`` more); ``keyed_tail``:
    the tail has the key too (as reads of a live log would need)."""
    if keyed_tail and move_every is None:
        raise ValueError("keyed_tail is a tail layout: it needs move_every")
    with tempfile.TemporaryDirectory(prefix="bench-sqlite-pages-") as tmp:
        con = _open(os.path.join(tmp, "ledger.db"), foreign_key=foreign_key)
        try:
            _store_history(con, history, steps, bare=responses)
            ids = [f"resp_{secrets.token_hex(24)}" for _ in range(logs)]
            _store_responses(con, ids, "in_progress")
            target = "events" if move_every is None else "keyed_tail" if keyed_tail else "tail"
            insert = f"INSERT INTO {target} VALUES (?, ?, ?, ?, ?, ?)"
            frames = 0
            commits: list[float] = []
            moves: list[float] = []
            cpu0 = time.process_time()
            for step in range(steps):
                now = time.time()
                rows = [_live_event(rid, step, now) for rid in ids]
                started = time.perf_counter()
                con.execute("BEGIN IMMEDIATE")
                con.executemany(insert, rows)
                con.execute("COMMIT")
                commits.append(time.perf_counter() - started)
                if move_every is not None and (step + 1) % move_every == 0:
                    started = time.perf_counter()
                    con.execute("BEGIN IMMEDIATE")
                    con.execute(
                        f"INSERT INTO events SELECT * FROM {target} ORDER BY response_id, seq"
                    )
                    con.execute(f"DELETE FROM {target}")
                    con.execute("COMMIT")
                    moves.append(time.perf_counter() - started)
                if (step + 1) % _CHECKPOINT_EVERY == 0:
                    frames += _frames(con)
            cpu = time.process_time() - cpu0
            if move_every is not None:  # the rest, as a server would before it stops
                con.execute(f"INSERT INTO events SELECT * FROM {target} ORDER BY response_id, seq")
                con.execute(f"DELETE FROM {target}")
            stored = con.execute("SELECT count(*) FROM events").fetchone()[0]
            if stored != (history + logs) * steps:
                raise RuntimeError(f"{stored} events stored, {(history + logs) * steps} written")
        finally:
            con.close()
    return {
        **_figures(cpu, logs * steps, frames, commits),
        # the stall a move is, for the commits queued behind it (0: no moves)
        "move_median_ms": statistics.median(moves) * 1e3 if moves else 0.0,
        "move_max_ms": max(moves, default=0.0) * 1e3,
    }


def run_churn(
    logs: int, length: int, commits: int, history: int, *, queue: bool
) -> dict[str, float]:
    """Steady-state churn: ``logs`` slots, each streaming responses of ``length`` events one
    after another, their starts staggered so that every commit finishes about ``logs / length``
    responses and starts as many (as on a live server, not all at once). A response's last event
    and its status change share a commit, as in the ledger; the next response of the slot is
    created in the same commit. ``length`` commits bring the slots to steady state first (not
    measured), then ``commits`` are measured. Both layouts have the foreign key to
    ``responses``:

    - ``queue=False``: the ledger's layout (events straight into the indexed table);
    - ``queue=True``: each commit appends to ``tail`` (a rowid table, no index); the writer
      knows each live log's rowids (one writer, rowids consecutive within its insert), and a
      response's last commit copies its rows into the indexed table by those rowids, in key
      order, in the same transaction; each commit also deletes the tail's rows below the oldest
      live log's first rowid (what was copied and is now older than anything live).
    """
    with tempfile.TemporaryDirectory(prefix="bench-sqlite-pages-") as tmp:
        con = _open(os.path.join(tmp, "ledger.db"), foreign_key=True)
        try:
            if queue:
                con.execute("DROP TABLE tail")
                con.execute(f"CREATE TABLE tail ({_COLUMNS}{_FOREIGN_KEY})")
            _store_history(con, history, length)
            # per slot: [response id, next seq, its tail rowids]; slot j's first response
            # starts after j * length // logs commits (the stagger)
            new_ids = [f"resp_{secrets.token_hex(24)}" for _ in range(logs)]
            _store_responses(con, new_ids, "in_progress")
            live: list[list[Any]] = [
                [rid, -(j * length // logs), []] for j, rid in enumerate(new_ids)
            ]
            insert = f"INSERT INTO {'tail' if queue else 'events'} VALUES (?, ?, ?, ?, ?, ?)"
            frames = 0
            times: list[float] = []
            cpu0 = 0.0
            for step in range(length + commits):
                if step == length:
                    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                    cpu0 = time.process_time()
                now = time.time()
                writing = [slot for slot in live if slot[1] >= 0]
                rows = [_live_event(slot[0], slot[1], now) for slot in writing]
                started = time.perf_counter()
                con.execute("BEGIN IMMEDIATE")
                con.executemany(insert, rows)
                if queue and rows:
                    last = con.execute("SELECT max(rowid) FROM tail").fetchone()[0]
                    for offset, slot in enumerate(writing, start=last - len(rows) + 1):
                        slot[2].append(offset)
                done = [slot for slot in writing if slot[1] == length - 1]
                for slot in done:
                    if queue:
                        con.execute(
                            "INSERT INTO events SELECT * FROM tail WHERE rowid IN "
                            "(SELECT value FROM json_each(?)) ORDER BY seq",
                            (json.dumps(slot[2]),),
                        )
                    con.execute(
                        "UPDATE responses SET status = 'completed' WHERE id = ?", (slot[0],)
                    )
                if done:
                    fresh = [f"resp_{secrets.token_hex(24)}" for _ in done]
                    con.executemany(
                        "INSERT INTO responses VALUES (?, 'in_progress', ?)",
                        [(rid, _REQUEST) for rid in fresh],
                    )
                    for slot, rid in zip(done, fresh, strict=True):
                        slot[:] = [rid, -1, []]
                if queue:
                    oldest = min((slot[2][0] for slot in live if slot[2]), default=None)
                    if oldest is not None:
                        con.execute("DELETE FROM tail WHERE rowid < ?", (oldest,))
                con.execute("COMMIT")
                if step >= length:
                    times.append(time.perf_counter() - started)
                for slot in live:
                    slot[1] += 1
                if step >= length and (step - length + 1) % _CHECKPOINT_EVERY == 0:
                    frames += _frames(con)
            cpu = time.process_time() - cpu0
            # every completed response, those finished during the run among them, has all
            # its events in the indexed table (in the queue layout: copied whole)
            completed, incomplete = con.execute(
                "SELECT count(*), count(*) FILTER (WHERE n <> ?) FROM (SELECT r.id,"
                " (SELECT count(*) FROM events e WHERE e.response_id = r.id) AS n"
                " FROM responses r WHERE r.status = 'completed')",
                (length,),
            ).fetchone()
            if incomplete or completed <= history:
                raise RuntimeError(
                    f"{incomplete} of {completed} completed logs lack events in the table"
                    f" ({history} stored before the run)"
                )
        finally:
            con.close()
    return _figures(cpu, logs * commits, frames, times)


def _alternated(
    layouts: dict[str, Any], reps: int, run: Callable[[Any], dict[str, float]]
) -> dict[str, list[dict[str, float]]]:
    """``run(layout)`` ``reps`` times for each layout, the layouts in turn, so a slow minute
    falls on all of them."""
    results: dict[str, list[dict[str, float]]] = {name: [] for name in layouts}
    for _ in range(reps):
        for name, layout in layouts.items():
            results[name].append(run(layout))
    return results


def _medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def _print_churn(args: argparse.Namespace) -> int:
    layouts = {"indexed + foreign key": False, "queue + copy at finish": True}
    results = _alternated(
        layouts,
        args.reps,
        lambda queue: run_churn(args.logs, args.steps, args.churn, args.history, queue=queue),
    )
    print(
        f"{args.logs} live logs of {args.steps} events each, staggered, {args.churn} commits "
        f"measured, {args.history} finished logs stored first, SQLite {sqlite3.sqlite_version}, "
        f"median of {args.reps}"
    )
    print(
        "| layout | µs CPU an event | WAL frames an event | commit ms p50 / p99 / max | runs (µs) |"
    )
    print("|---|--:|--:|--:|---|")
    for name, runs in results.items():
        m = _medians(runs)
        longest = max(r["commit_max_ms"] for r in runs)
        every = ", ".join(f"{r['us_per_event']:.1f}" for r in runs)
        print(
            f"| {name} | {m['us_per_event']:.1f} | {m['frames_per_event']:.2f} | "
            f"{m['commit_p50_ms']:.2f} / {m['commit_p99_ms']:.2f} / {longest:.2f} | {every} |"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.sqlite_pages", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--logs", type=int, default=256, help="live logs (paced streams)")
    parser.add_argument("--steps", type=int, default=200, help="commits, one event a log each")
    parser.add_argument("--history", type=int, default=2000, help="finished logs stored first")
    parser.add_argument(
        "--responses", type=int, default=0, help="responses rows besides the logs' (no events)"
    )
    parser.add_argument(
        "--moves", default="25,50", help="K of the tail layouts, comma-separated ('' for none)"
    )
    parser.add_argument("--reps", type=int, default=2, help="runs of each layout (median shown)")
    parser.add_argument(
        "--churn",
        type=int,
        metavar="COMMITS",
        help="measure this many commits of steady-state churn instead (responses of --steps "
        "events finishing and starting one by one): the ledger's layout against a queue copied "
        "at each response's finish (run_churn)",
    )
    args = parser.parse_args(argv)
    if args.churn:
        return _print_churn(args)
    # layout -> run_layout's keywords
    layouts: dict[str, dict[str, Any]] = {
        "indexed": {"move_every": None},
        "indexed + foreign key": {"move_every": None, "foreign_key": True},
    }
    for k in map(int, filter(None, args.moves.split(","))):
        layouts[f"tail + move every {k}"] = {"move_every": k}
        layouts[f"keyed tail + move every {k}"] = {"move_every": k, "keyed_tail": True}
    results = _alternated(
        layouts,
        args.reps,
        lambda layout: run_layout(
            args.logs, args.steps, args.history, responses=args.responses, **layout
        ),
    )
    print(
        f"{args.logs} live logs x {args.steps} commits of one event each, {args.history} finished "
        f"logs stored first, {args.history + args.responses + args.logs} responses rows, "
        f"SQLite {sqlite3.sqlite_version}, median of {args.reps}"
    )
    print(
        "| layout | µs CPU an event | WAL frames an event | commit ms p50 / p99 | move ms median / max"
        " | runs (µs) |"
    )
    print("|---|--:|--:|--:|--:|---|")
    for name, runs in results.items():
        m = _medians(runs)
        longest = max(r["move_max_ms"] for r in runs)
        moves = f"{m['move_median_ms']:.1f} / {longest:.1f}" if longest else "-"
        every = ", ".join(f"{r['us_per_event']:.1f}" for r in runs)
        print(
            f"| {name} | {m['us_per_event']:.1f} | {m['frames_per_event']:.2f}"
            f" | {m['commit_p50_ms']:.2f} / {m['commit_p99_ms']:.2f} | {moves} | {every} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
