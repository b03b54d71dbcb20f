"""Runs targets side by side under the same load and measures what each token costs.

For every concurrency level, for every target: start the server on a fresh database (pinned with
``taskset`` to the server CPUs), run one unmeasured warm-up load, then ``reps`` measured loads with
:mod:`bench.loadgen` (pinned to the load generator CPUs), then stop the server. Interleaving the
targets per concurrency level keeps the ratio to the naive peer honest when the machine's speed
drifts during a long run.

Per measured run:

- delivered tokens/s: delta events read by the load generator per second of its wall time;
- latency p50/p99: engine yield to client read, from the token-times side channel; "mid p99"
  the p99 of each stream's deltas but its first and last ten (its steady state: streams that
  start and end together hold up each other's first and last tokens);
- server CPU µs per token: ``utime + stime`` of the server process and its descendants
  (``/proc/<pid>/stat``, clock ticks) before and after the load, over the tokens delivered;
  PostgreSQL's work is in its backends, reported separately as "DB µs/tok" (sum over the
  backends connected to the run's database, ``pg_stat_activity``);
- bytes written per token: ``write_bytes`` of the server process and its descendants
  (``/proc/<pid>/io``: what they sent towards the disk, page cache included: SQLite's WAL pages
  and checkpoints, the token-times files; "-" where the kernel does not count it), before and
  after the load, over the tokens delivered;
- bytes stored per token: growth of the database over the tokens delivered. SQLite: the database
  file plus its WAL, after a ``wal_checkpoint(TRUNCATE)`` on both sides of the run (falls back to
  the raw sizes when the checkpoint is refused); PostgreSQL: ``pg_database_size``;
- peak memory: ``VmHWM`` of the server, reset (``clear_refs`` 5) before each run where allowed;
- the load generator's own CPU (if it nears 1.0 core it may be the bottleneck) and the CPU used by
  anything else on the machine during the run ("other CPU", in cores: a noisy neighbour shows up
  here; the harness also waits, up to ``quiet_timeout_s``, for the machine to be idle before
  each run);
- slow commits: the server's commits that took over 100 ms during the run, of all its commits,
  from its ``ledger_commit_latency_seconds`` histogram (``GET /metrics`` before and after the
  load; "-" for a server without one): a latency p99 of hundreds of ms with slow commits is the
  disk's fsync stalling, which every durable commit waits for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import samples, token_times
from bench.targets import (
    POSTGRES_ADMIN_DSN,
    REPO_ROOT,
    Target,
    placeholders,
    postgres_url,
    render_argv,
    server_env,
)
from bench.turns import LATENCY_SAMPLES

__all__ = [
    "MatrixConfig",
    "RunResult",
    "Summary",
    "machine_info",
    "render_markdown",
    "run_matrix",
    "summarize",
]

CLK_TCK = os.sysconf("SC_CLK_TCK")
HOST = "127.0.0.1"


@dataclass(frozen=True)
class MatrixConfig:
    concurrency: tuple[int, ...] = (1, 16, 64, 256)
    reps: int = 3
    #: Rounds of the whole matrix, one after the other: each round runs every cell (C, target)
    #: in turn with a fresh server, so a slow spell of a shared machine falls on every target of
    #: a round, not on one target's reps. With more than one, a cell's ratio is the median over
    #: the rounds of its tokens/s over the reference's in the same round (a paired ratio).
    rounds: int = 1
    tokens: int = 1000
    #: The step of the paced engines (the ledger's scripted engine, the naive peer): every stream
    #: gets one token per step, as from a real engine's step loop (0: as fast as they can). A
    #: paced engine measures the latency the server adds while it keeps up.
    token_delay_ms: float = 0.0
    #: Tokens per measured run; each worker runs ceil(total / (C * tokens)) streams, at least 1.
    total_tokens: int = 400_000
    #: A run stops starting new streams after this long, so a slow target does not take hours.
    max_run_seconds: float | None = 20.0
    latency: bool = True
    server_cpus: str | None = "0"
    loadgen_cpus: str | None = "1"
    loadgen_loop: str = "auto"
    #: ``nice`` value for the server and the load generator (negative needs root): on a shared
    #: machine, keeps other work from taking their cores during a run.
    nice: int | None = None
    startup_timeout_s: float = 120.0
    stream_timeout_s: float = 300.0
    quiet_timeout_s: float = 30.0
    #: Foreign CPU (in cores) below which the machine counts as quiet.
    quiet_threshold: float = 0.15
    warmup: bool = True
    #: Spread the streams' starts over one stream's paced duration (``tokens`` steps), so they
    #: end and start again one by one, as on a live server, instead of all together (paced
    #: runs only). Tokens/s then counts the ramp up and down: read the latency.
    stagger: bool = False
    #: Open loop (paced runs only): the streams arrive as a Poisson process at ``C`` streams a
    #: stream's duration (so ``C`` are in flight on average) whatever the server's pace, instead
    #: of ``C`` workers each starting its next stream when its last has ended; the latency
    #: counts the streams that start after the first stream's duration (the run starts empty).
    open_loop: bool = False
    keep_workdirs: bool = False
    workdir_root: Path | None = None
    #: Profile every measured run's server under cProfile (``bench.profiled``) and keep the
    #: profiles here, ``<target>-c<C>-round<R>-rep<K>.prof`` with a ``.json`` of the run's
    #: tokens and streams (``bench.cpu_split`` reads them). Those runs' CPU figures are inflated.
    profile_dir: Path | None = None
    #: Sample every measured run's server with py-spy (``bench.samples``) and keep the stacks
    #: here, ``<target>-c<C>-round<R>-rep<K>.txt`` with a ``.json`` of the run's tokens and
    #: server CPU. Unlike ``profile_dir``, the runs' figures stay the server's own.
    sample_dir: Path | None = None
    #: Time every measured run's event-loop turns and group commits in the server
    #: (``bench.turns``, on asyncio's own loop) and keep each run's record here,
    #: ``<target>-c<C>-round<R>-rep<K>.json``, with its deltas' latency samples.
    turns_dir: Path | None = None
    #: The ledger's database holds this many finished responses before its server starts
    #: (``bench.sweeps.fill``, then ``ANALYZE``): what a server in service has stored, for
    #: the costs that grow with it (the periodic sweeps, the planners' choices).
    history: int = 0
    log: Callable[[str], None] = field(
        default=lambda line: print(line, file=sys.stderr, flush=True)
    )

    def streams_per_worker(self, concurrency: int) -> int:
        per_stream = concurrency * max(1, self.tokens)
        return max(1, -(-self.total_tokens // per_stream))


@dataclass
class RunResult:
    target: str
    concurrency: int
    rep: int
    #: Which round of the matrix (``MatrixConfig.rounds``) the run belongs to.
    round: int = 0
    streams: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    tokens: int = 0
    wall_s: float = 0.0
    tokens_per_s: float = 0.0
    latency_p50_ms: float | None = None
    latency_p99_ms: float | None = None
    #: p99 of each stream's deltas but its first and last ten (``bench.loadgen``'s
    #: ``latency_mid_ms``): the steady state, without the bursts of streams that end and start
    #: together.
    latency_mid_p99_ms: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    server_cpu_us_per_token: float | None = None
    server_cpu_util: float | None = None
    db_cpu_us_per_token: float | None = None
    #: The kernel's part of ``server_cpu_us_per_token`` (system time: socket writes, the WAL).
    server_sys_us_per_token: float | None = None
    loadgen_cpu_us_per_token: float | None = None
    loadgen_cpu_util: float | None = None
    #: What the server wrote towards the disk (``/proc/<pid>/io`` ``write_bytes``) a token.
    server_written_bytes_per_token: float | None = None
    bytes_per_token: float | None = None
    peak_rss_mib: float | None = None
    other_cpu_cores: float | None = None
    quiet_wait_s: float = 0.0
    #: The server's commits over ``SLOW_COMMIT_S`` during the run, and all of them (None: it
    #: reports no commits).
    slow_commits: int | None = None
    commits: int | None = None
    #: Open loop: the streams the load generator started over a millisecond after their
    #: arrival time (then it, not the server, shaped the load); None in a closed loop.
    late_arrivals: int | None = None
    failure: str | None = None


#: A commit slower than this (seconds; a bucket bound of ``app.metrics``' latency histogram)
#: counts as slow.
SLOW_COMMIT_S = "0.1"
_COMMIT_LATENCY = "ledger_commit_latency_seconds"


def commit_counts(metrics_text: str) -> tuple[int, int] | None:
    """(commits slower than ``SLOW_COMMIT_S``, all commits) from a Prometheus text exposition;
    None when it has no commit latency histogram."""
    within = total = None
    for line in metrics_text.splitlines():
        if line.startswith(f'{_COMMIT_LATENCY}_bucket{{le="{SLOW_COMMIT_S}"}} '):
            within = int(float(line.rsplit(" ", 1)[1]))
        elif line.startswith(f"{_COMMIT_LATENCY}_count "):
            total = int(float(line.rsplit(" ", 1)[1]))
    if within is None or total is None:
        return None
    return total - within, total


def _server_commits(port: int) -> tuple[int, int] | None:
    """``commit_counts`` of the server on ``port`` (None: it serves no such metrics)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
            return commit_counts(answer.read().decode())
    except OSError:  # (a 404 included: the naive peer has no /metrics)
        return None


# -- /proc -------------------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses; fields resume after the last ')'.
    return raw[raw.rindex(")") + 2 :].split()


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(children.get(current, []))
    return out


def _cpu_ticks(pids: Iterable[int], kernel: dict[int, int] | None = None) -> dict[int, int]:
    """utime + stime + cutime + cstime per live pid (fields 14-17 of /proc/<pid>/stat); with
    ``kernel``, also its stime + cstime, put there."""
    ticks = {}
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is not None:
            ticks[pid] = sum(int(v) for v in fields[11:15])
            if kernel is not None:
                kernel[pid] = int(fields[12]) + int(fields[14])
    return ticks


def _tree_cpu_s(pid: int, kernel: dict[int, int] | None = None) -> dict[int, int]:
    return _cpu_ticks(_descendants(pid), kernel)


def _tree_written(pid: int) -> dict[int, int] | None:
    """``write_bytes`` of ``/proc/<pid>/io`` per live process of ``pid``'s tree; None when the
    kernel counts none (no I/O accounting, or not readable)."""
    written = {}
    for each in _descendants(pid):
        try:
            lines = Path(f"/proc/{each}/io").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            if line.startswith("write_bytes:"):
                written[each] = int(line.split()[1])
    return written or None


def _delta_s(before: dict[int, int], after: dict[int, int]) -> float:
    return sum(t - before.get(pid, 0) for pid, t in after.items()) / CLK_TCK


def _system_busy_s() -> float:
    """CPU seconds spent busy by all CPUs since boot (user+nice+system+irq+softirq+steal)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def _vm_hwm_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _reset_hwm(pid: int) -> bool:
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _wait_quiet(config: MatrixConfig) -> float:
    """Wait until the machine is idle (nothing of ours runs now); returns the seconds waited."""
    start = time.monotonic()
    while True:
        b0, t0 = _system_busy_s(), time.monotonic()
        time.sleep(0.5)
        busy = (_system_busy_s() - b0) / (time.monotonic() - t0)
        waited = time.monotonic() - start
        if busy <= config.quiet_threshold or waited >= config.quiet_timeout_s:
            if busy > config.quiet_threshold:
                config.log(
                    f"  machine still busy ({busy:.2f} cores) after {waited:.0f} s; going on"
                )
            return waited if waited > 0.6 else 0.0


# -- databases ---------------------------------------------------------------------------------


class _NoDatabase:
    url: str | None = None

    def create(self) -> None: ...

    def size(self) -> int | None:
        return None

    def backend_cpu(self) -> dict[int, int]:
        return {}

    def drop(self) -> None: ...


class _SqliteDatabase(_NoDatabase):
    def __init__(self, workdir: Path) -> None:
        self.path = workdir / "ledger.db"
        self.url = f"sqlite+aiosqlite:///{self.path}"

    def size(self) -> int | None:
        if not self.path.exists():
            return 0
        try:
            con = sqlite3.connect(self.path, timeout=5)
            try:
                con.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            finally:
                con.close()
        except sqlite3.Error:
            pass
        total = 0
        for suffix in ("", "-wal"):
            p = Path(f"{self.path}{suffix}")
            if p.exists():
                total += p.stat().st_size
        return total


def _pg(coro_fn: Callable[[Any], Any], dsn: str = POSTGRES_ADMIN_DSN) -> Any:
    import asyncpg

    async def run() -> Any:
        con = await asyncpg.connect(dsn, timeout=10)
        try:
            return await coro_fn(con)
        finally:
            await con.close()

    return asyncio.run(run())


class _PostgresDatabase(_NoDatabase):
    def __init__(self) -> None:
        self.name = f"bench_{uuid.uuid4().hex[:12]}"
        self.url = postgres_url(self.name)

    def create(self) -> None:
        _pg(lambda con: con.execute(f'CREATE DATABASE "{self.name}"'))

    def size(self) -> int | None:
        return _pg(lambda con: con.fetchval("SELECT pg_database_size($1)", self.name))

    def backend_cpu(self) -> dict[int, int]:
        pids = _pg(
            lambda con: con.fetch("SELECT pid FROM pg_stat_activity WHERE datname = $1", self.name)
        )
        return _cpu_ticks(int(r["pid"]) for r in pids)

    def drop(self) -> None:
        _pg(lambda con: con.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'))


def _database_for(target: Target, workdir: Path) -> _NoDatabase:
    if target.database == "sqlite":
        return _SqliteDatabase(workdir)
    if target.database == "postgres":
        return _PostgresDatabase()
    return _NoDatabase()


# -- processes ---------------------------------------------------------------------------------


def _pinned(cpus: str | None, argv: Sequence[str], nice: int | None = None) -> list[str]:
    """``argv`` prefixed with ``nice -n`` and ``taskset -c`` as asked (both exec the command)."""
    out = list(argv)
    if cpus is not None and shutil.which("taskset") is not None:
        out = ["taskset", "-c", cpus, *out]
    if nice is not None:
        out = ["nice", "-n", str(nice), *out]
    return out


def _raise_priority(pid: int, nice: int | None) -> None:
    """Give ``pid``'s autogroup the ``nice`` value too.

    With ``sched_autogroup_enabled`` (the default on desktop-style kernels) every session is a
    scheduling group, and ``nice`` only ranks processes inside their group: the servers and load
    generators are started in sessions of their own, whose group weight is set here.
    """
    if nice is None:
        return
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))


def usable_cpus(config: MatrixConfig) -> MatrixConfig:
    """Drop pinning the machine cannot honour (fewer CPUs than asked for, no taskset)."""
    available = os.sched_getaffinity(0)
    wanted = set()
    for spec in (config.server_cpus, config.loadgen_cpus):
        if spec is None:
            continue
        for part in spec.split(","):
            lo, _, hi = part.partition("-")
            wanted.update(range(int(lo), int(hi or lo) + 1))
    if shutil.which("taskset") is None or not wanted <= available:
        config.log(
            f"not pinning: CPUs {sorted(wanted)} requested, {sorted(available)} available"
            f"{'' if shutil.which('taskset') else ', no taskset'}"
        )
        return replace(config, server_cpus=None, loadgen_cpus=None)
    return config


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class _Server:
    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            argv,
            env=env,
            cwd=REPO_ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, port: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                with socket.create_connection((HOST, port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"server not listening on {port} after {timeout_s} s: {self.log_tail()}")

    def log_tail(self, chars: int = 1500) -> str:
        self._log.flush()
        try:
            return self.log_path.read_bytes()[-chars:].decode(errors="replace")
        except OSError:
            return "?"

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGINT)
                self.proc.wait(timeout=15)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=15)
        self._log.close()


#: The ledger server's start-up line (``app.transport.Server.startup``): the event loop and the
#: HTTP parser it runs on, and why when ``auto`` found uvloop or httptools missing.
_SERVED_ON = re.compile(r"event loop: \w+; HTTP parser: \w+(?: \([^)]*\))?")


def _served_on(log_path: Path) -> str | None:
    """What the server's log says it runs on (its start-up line), or None."""
    try:
        with open(log_path, "rb") as log:
            head = log.read(256 * 1024).decode(errors="replace")
    except OSError:
        return None
    found = _SERVED_ON.search(head)
    return None if found is None else found.group(0)


def _run_loadgen(
    config: MatrixConfig,
    target: Target,
    port: int,
    concurrency: int,
    streams_per_worker: int,
    times_dir: Path | None,
    out: Path,
) -> dict:
    body = json.dumps(target.body(config.tokens))
    argv = [
        sys.executable,
        "-m",
        "bench.loadgen",
        "--url",
        f"http://{HOST}:{port}/v1/responses",
        "--concurrency",
        str(concurrency),
        "--streams-per-worker",
        str(streams_per_worker),
        "--body",
        body,
        "--timeout",
        str(config.stream_timeout_s),
        "--loop",
        config.loadgen_loop,
        "--out",
        str(out),
    ]
    expected = target.expected_events(config.tokens)
    if expected is not None:
        argv += ["--expected-events", str(expected)]
    if target.token_marker is not None:
        argv += ["--token-marker", target.token_marker, "--expected-tokens", str(config.tokens)]
    if times_dir is not None:
        argv += ["--token-times-dir", str(times_dir), "--token-offset", str(target.token_offset)]
    if config.max_run_seconds:
        argv += ["--max-seconds", str(config.max_run_seconds)]
    if config.turns_dir is not None and times_dir is not None:
        argv += ["--samples", str(LATENCY_SAMPLES)]  # the deltas over the run (bench.turns)
    duration_s = config.tokens * config.token_delay_ms / 1000
    if config.stagger and duration_s:
        argv += ["--stagger-seconds", str(duration_s)]
    if config.open_loop and duration_s:
        argv += [
            "--arrival-rate",
            str(concurrency / duration_s),
            "--measure-from-seconds",
            str(duration_s),
        ]
    proc = subprocess.Popen(
        _pinned(config.loadgen_cpus, argv, config.nice),
        cwd=REPO_ROOT,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    _raise_priority(proc.pid, config.nice)
    _, stderr = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(
            f"load generator failed ({proc.returncode}): {stderr.decode(errors='replace')[-1500:]}"
        )
    return json.loads(out.read_text())


# -- one server, several runs ------------------------------------------------------------------


def _clear(directory: Path) -> None:
    for entry in directory.iterdir():
        entry.unlink()


def _measure(
    config: MatrixConfig,
    target: Target,
    server: _Server,
    database: _NoDatabase,
    port: int,
    concurrency: int,
    rep: int,
    workdir: Path,
    times_dir: Path | None,
    round_: int = 0,
) -> RunResult:
    result = RunResult(target.name, concurrency, rep, round=round_)
    result.quiet_wait_s = _wait_quiet(config)
    if times_dir is not None:
        _clear(times_dir)
    hwm_reset = _reset_hwm(server.pid)
    commits0 = _server_commits(port)
    size0 = database.size()
    db_cpu0 = database.backend_cpu()
    kernel0: dict[int, int] = {}
    cpu0 = _tree_cpu_s(server.pid, kernel0)
    written0 = _tree_written(server.pid)
    busy0, window0 = _system_busy_s(), time.monotonic()
    lg_self0 = _children_cpu_s()
    if config.profile_dir is not None or config.turns_dir is not None:
        os.kill(server.pid, signal.SIGUSR1)  # bench.profiled, bench.turns: from now on
    with (
        _sampling(server.pid, workdir / "server.samples")
        if config.sample_dir
        else contextlib.nullcontext()
    ):
        report = _run_loadgen(
            config,
            target,
            port,
            concurrency,
            config.streams_per_worker(concurrency),
            times_dir,
            workdir / f"loadgen-{concurrency}-{rep}.json",
        )
    busy1, window1 = _system_busy_s(), time.monotonic()
    lg_self1 = _children_cpu_s()
    kernel1: dict[int, int] = {}
    cpu1 = _tree_cpu_s(server.pid, kernel1)
    written1 = _tree_written(server.pid)
    db_cpu1 = database.backend_cpu()
    size1 = database.size()
    commits1 = _server_commits(port)
    if commits0 is not None and commits1 is not None:
        result.slow_commits = commits1[0] - commits0[0]
        result.commits = commits1[1] - commits0[1]

    tokens = report["tokens"]
    wall = report["wall_s"]
    server_s = _delta_s(cpu0, cpu1)
    db_s = _delta_s(db_cpu0, db_cpu1)
    result.streams = report["streams"]
    result.errors = report["error_count"]
    result.error_samples = report["errors"][:3]
    result.tokens = tokens
    result.wall_s = wall
    result.tokens_per_s = report["tokens_per_s"]
    latency = report.get("latency_ms")
    if latency and latency["streams_without_file"] and rep == 0:
        config.log(
            f"  {latency['streams_without_file']} of {report['streams']} streams have no "
            f"token times: does the server implement {token_times.ENV_VAR}?"
        )
    if latency and latency["n"]:
        result.latency_p50_ms = latency["p50"]
        result.latency_p99_ms = latency["p99"]
        if report["latency_mid_ms"]["n"]:  # (none when streams have 20 deltas or fewer)
            result.latency_mid_p99_ms = report["latency_mid_ms"]["p99"]
    result.late_arrivals = report.get("late_arrivals")
    if result.late_arrivals:
        config.log(
            f"  {result.late_arrivals} of {report['streams']} streams started over 1 ms after "
            "their arrival time: the load generator fell behind its schedule"
        )
    if report["ttft_ms"]["n"]:
        result.ttft_p50_ms = report["ttft_ms"]["p50"]
        result.ttft_p99_ms = report["ttft_ms"]["p99"]
    if tokens:
        result.server_cpu_us_per_token = server_s * 1e6 / tokens
        result.server_sys_us_per_token = _delta_s(kernel0, kernel1) * 1e6 / tokens
        result.loadgen_cpu_us_per_token = report["loadgen_cpu_s"] * 1e6 / tokens
        if written0 is not None and written1 is not None:
            written = sum(n - written0.get(each, 0) for each, n in written1.items())
            result.server_written_bytes_per_token = written / tokens
        if database.url is not None and target.database == "postgres":
            result.db_cpu_us_per_token = db_s * 1e6 / tokens
        if size0 is not None and size1 is not None:
            result.bytes_per_token = (size1 - size0) / tokens
    if wall:
        result.server_cpu_util = server_s / wall
        result.loadgen_cpu_util = report["loadgen_cpu_util"]
        # Everything busy during the load generator's life that was not the server, the load
        # generator or our database backends (their start-up is short and counted as ours).
        ours = server_s + (lg_self1 - lg_self0) + db_s
        result.other_cpu_cores = max(0.0, (busy1 - busy0) - ours) / (window1 - window0)
    # Without the reset (not allowed here) this is the peak since the server started.
    result.peak_rss_mib = _vm_hwm_mib(server.pid)
    if not hwm_reset and rep == 0:
        config.log("  could not reset VmHWM: peak RSS is since the server started")
    if config.profile_dir is not None:
        _keep_profile(config.profile_dir, server, workdir / "server.prof", result)
    if config.sample_dir is not None:
        _keep_run_file(
            config.sample_dir, workdir / "server.samples", ".txt", result, server_cpu_s=server_s
        )
    if config.turns_dir is not None:
        _keep_turns(config.turns_dir, server, workdir / "server.turns", result, report)
    return result


@contextlib.contextmanager
def _sampling(pid: int, out: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``py-spy record`` against the server ``pid`` for the ``with`` block (``bench.samples``):
    its stacks written to ``out`` when the block ends, the sampler killed if the block fails (not
    left sampling a server the run gives up on)."""
    proc = _start_sampler(pid, out)
    try:
        yield proc
    except BaseException:
        proc.kill()
        proc.communicate()  # (and its stderr pipe closed)
        raise
    _stop_sampler(proc, out)


def _start_sampler(pid: int, out: Path) -> subprocess.Popen[bytes]:
    exe = samples.py_spy()
    if exe is None:
        raise RuntimeError("--sample needs py-spy (pip install py-spy; `make setup-test` does)")
    argv = [exe, "record", "--pid", str(pid), "--rate", str(samples.RATE)]
    argv += ["--format", "raw", "--full-filenames", "--nonblocking", "--output", str(out)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(0.5)  # it attaches, or says why not
    if proc.poll() is not None:
        error = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        raise RuntimeError(f"py-spy could not sample the server: {error.strip()[:500]}")
    return proc


def _stop_sampler(proc: subprocess.Popen[bytes], out: Path) -> None:
    """Stop the sampler as Control-C does: it writes its stacks, then exits."""
    proc.send_signal(signal.SIGINT)
    try:
        _, error = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise RuntimeError("py-spy did not stop") from None
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(
            f"py-spy wrote no samples (exit {proc.returncode}): "
            f"{error.decode(errors='replace').strip()[:500]}"
        )


def _run_name(result: RunResult) -> str:
    """What a measured run's kept files are named: ``<target>-c<C>-round<R>-rep<K>``."""
    return f"{result.target}-c{result.concurrency}-round{result.round}-rep{result.rep}"


def _keep_run_file(
    directory: Path, written: Path, suffix: str, result: RunResult, **extra: Any
) -> None:
    """Keep a measured run's file (a profile, samples) under ``directory`` as
    ``<target>-c<C>-round<R>-rep<K><suffix>``, with a ``.json`` of the run beside it: what
    ``bench.cpu_split`` and ``bench.samples`` need to know of it."""
    name = _run_name(result)
    directory.mkdir(parents=True, exist_ok=True)
    shutil.move(written, directory / f"{name}{suffix}")
    meta = {
        "target": result.target,
        "concurrency": result.concurrency,
        "round": result.round,
        "rep": result.rep,
        "tokens": result.tokens,
        "streams": result.streams,
        **extra,
    }
    (directory / f"{name}.json").write_text(json.dumps(meta))


def _wrapped_argv(argv: Sequence[str], wrapper: str, out: Path) -> list[str]:
    """A server's ``python (-m MODULE | -c CODE) ARGS`` run under ``wrapper`` (``bench.profiled``
    or ``bench.turns``), which writes ``out`` on SIGUSR2."""
    python, *rest = argv
    return [python, "-m", wrapper, str(out), "--", *rest]


def _signalled(server: _Server, written: Path, what: str) -> None:
    """Send the server's wrapper SIGUSR2 and wait for the file it then writes."""
    written.unlink(missing_ok=True)
    os.kill(server.pid, signal.SIGUSR2)
    deadline = time.monotonic() + 60
    while not written.exists():
        if time.monotonic() > deadline or server.proc.poll() is not None:
            raise RuntimeError(f"the server wrote no {what}: {server.log_tail()}")
        time.sleep(0.05)


def _keep_profile(directory: Path, server: _Server, written: Path, result: RunResult) -> None:
    """Stop the server's profile (``bench.profiled`` writes it on SIGUSR2) and keep it, with
    what ``bench.cpu_split`` needs to know of the run, under ``directory``."""
    _signalled(server, written, "profile")
    _keep_run_file(directory, written, ".prof", result)


def _keep_turns(
    directory: Path, server: _Server, written: Path, result: RunResult, report: dict[str, Any]
) -> None:
    """Stop the server's record of turns and commits (``bench.turns`` writes it on SIGUSR2) and
    keep it under ``directory`` with the run's deltas' latency samples (yield time, ms)."""
    _signalled(server, written, "record of turns")
    record = json.loads(written.read_text())
    record["latency"] = [[s["yield_ns"], s["ms"]] for s in report.get("latency_samples", [])]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{_run_name(result)}.json").write_text(json.dumps(record))
    written.unlink()


def _children_cpu_s() -> float:
    """CPU seconds of this process's waited-for children (the load generators)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run_target(
    config: MatrixConfig, target: Target, concurrency: int, round_: int = 0
) -> list[RunResult]:
    workdir = Path(
        tempfile.mkdtemp(prefix=f"bench-{target.name}-c{concurrency}-", dir=config.workdir_root)
    )
    times_dir = workdir / "token_times" if config.latency else None
    if times_dir is not None:
        times_dir.mkdir()
    database = _database_for(target, workdir)
    server: _Server | None = None
    results: list[RunResult] = []
    try:
        database.create()
        if config.history and target.database in ("sqlite", "postgres"):
            from bench.sweeps import fill  # (it imports the store: only for this)

            started = time.monotonic()
            asyncio.run(fill(database.url, config.history, unfinished_every=config.history + 1))
            config.log(
                f"  {config.history:,} stored responses in {time.monotonic() - started:.1f} s"
            )
        port = _free_port()
        values = placeholders(HOST, port, workdir, database.url, config.token_delay_ms)
        values.update(target.prepare(workdir, config.tokens, config.token_delay_ms))
        extra_env = {token_times.ENV_VAR: str(times_dir)} if times_dir is not None else {}
        command = render_argv(target, values)
        if config.profile_dir is not None:
            command = _wrapped_argv(command, "bench.profiled", workdir / "server.prof")
        elif config.turns_dir is not None:
            command = _wrapped_argv(command, "bench.turns", workdir / "server.turns")
        argv = _pinned(config.server_cpus, command, config.nice)
        config.log(f"[{target.name} C={concurrency}] {shlex.join(argv)}")
        server = _Server(argv, server_env(target, extra_env), workdir / "server.log")
        _raise_priority(server.pid, config.nice)
        server.wait_ready(port, config.startup_timeout_s)
        if config.warmup:
            _wait_quiet(config)
            warm = _run_loadgen(
                config, target, port, min(concurrency, 16), 1, None, workdir / "warmup.json"
            )
            if warm["error_count"]:
                config.log(f"  warm-up errors: {warm['errors'][:3]}")
        for rep in range(config.reps):
            result = _measure(
                config, target, server, database, port, concurrency, rep, workdir, times_dir, round_
            )
            config.log(
                f"  rep {rep}: {result.tokens_per_s:,.0f} tok/s, "
                f"server {_fmt(result.server_cpu_us_per_token, 2)} µs/tok, "
                f"p50 {_fmt(result.latency_p50_ms, 3)} ms, errors {result.errors}, "
                f"other CPU {_fmt(result.other_cpu_cores, 2)}"
            )
            if result.errors:
                config.log(f"  errors: {result.error_samples}")
            results.append(result)
        runtime = _served_on(server.log_path)
        if runtime is not None:  # (the ledger's servers say it at start; the peers do not)
            config.log(f"  {runtime}")
    except Exception as exc:  # a target that fails must not stop the others
        message = f"{type(exc).__name__}: {exc}"
        config.log(f"  FAILED: {message}")
        results.append(
            RunResult(target.name, concurrency, len(results), round=round_, failure=message)
        )
    finally:
        if server is not None:
            server.stop()
        try:
            database.drop()
        except Exception as exc:
            config.log(f"  could not drop the database: {exc}")
        if config.keep_workdirs:
            config.log(f"  kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return results


def run_matrix(targets: Sequence[Target], config: MatrixConfig) -> list[RunResult]:
    """Run every target at every concurrency level; skips targets that are unavailable."""
    config = usable_cpus(config)
    runnable = []
    for target in targets:
        reason = target.unavailable()
        if reason:
            config.log(f"skipping {target.name}: {reason}")
        else:
            runnable.append(target)
    results: list[RunResult] = []
    for round_ in range(config.rounds):
        if config.rounds > 1:
            config.log(f"round {round_ + 1} of {config.rounds}")
        for concurrency in config.concurrency:
            for target in runnable:
                results.extend(_run_target(config, target, concurrency, round_))
    return results


# -- summaries and the table -------------------------------------------------------------------


@dataclass
class Summary:
    target: str
    concurrency: int
    reps: int
    tokens_per_s: float | None
    spread_pct: float | None
    ratio_to_naive: float | None
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    latency_mid_p99_ms: float | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    server_cpu_us_per_token: float | None
    server_sys_us_per_token: float | None
    server_cpu_util: float | None
    db_cpu_us_per_token: float | None
    loadgen_cpu_us_per_token: float | None
    loadgen_cpu_util: float | None
    server_written_bytes_per_token: float | None
    bytes_per_token: float | None
    peak_rss_mib: float | None
    other_cpu_cores: float | None
    slow_commits: float | None
    commits: float | None
    errors: int
    failure: str | None


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _paired_ratio(runs: Sequence[RunResult], reference: Sequence[RunResult]) -> float | None:
    """The median over rounds of a cell's tokens/s over the reference's in the same round
    (each round's own median of its reps); None unless both ran in at least two of the same
    rounds."""

    def by_round(of: Sequence[RunResult]) -> dict[int, float]:
        rounds: dict[int, list[float]] = {}
        for r in of:
            if r.failure is None and r.tokens_per_s:
                rounds.setdefault(r.round, []).append(r.tokens_per_s)
        return {k: statistics.median(v) for k, v in rounds.items()}

    mine, theirs = by_round(runs), by_round(reference)
    shared = sorted(set(mine) & set(theirs))
    if len(shared) < 2:
        return None
    return statistics.median(mine[k] / theirs[k] for k in shared)


def summarize(results: Sequence[RunResult], reference: str = "naive") -> list[Summary]:
    groups: dict[tuple[str, int], list[RunResult]] = {}
    for r in results:
        groups.setdefault((r.target, r.concurrency), []).append(r)
    medians: dict[tuple[str, int], float | None] = {}
    for key, runs in groups.items():
        medians[key] = _median(r.tokens_per_s for r in runs if r.failure is None)
    out = []
    for (name, c), runs in groups.items():
        ok = [r for r in runs if r.failure is None]
        tps = medians[(name, c)]
        ref = medians.get((reference, c))
        paired = _paired_ratio(runs, groups.get((reference, c), []))
        spread = None
        if tps and len(ok) > 1:
            spread = (max(r.tokens_per_s for r in ok) - min(r.tokens_per_s for r in ok)) / tps * 100

        def m(attr: str, runs: list[RunResult] = ok) -> float | None:
            return _median(getattr(r, attr) for r in runs)

        out.append(
            Summary(
                target=name,
                concurrency=c,
                reps=len(ok),
                tokens_per_s=tps,
                spread_pct=spread,
                ratio_to_naive=paired
                if paired is not None
                else (tps / ref)
                if tps and ref
                else None,
                latency_p50_ms=m("latency_p50_ms"),
                latency_p99_ms=m("latency_p99_ms"),
                latency_mid_p99_ms=m("latency_mid_p99_ms"),
                ttft_p50_ms=m("ttft_p50_ms"),
                ttft_p99_ms=m("ttft_p99_ms"),
                server_cpu_us_per_token=m("server_cpu_us_per_token"),
                server_sys_us_per_token=m("server_sys_us_per_token"),
                server_cpu_util=m("server_cpu_util"),
                db_cpu_us_per_token=m("db_cpu_us_per_token"),
                loadgen_cpu_us_per_token=m("loadgen_cpu_us_per_token"),
                loadgen_cpu_util=m("loadgen_cpu_util"),
                server_written_bytes_per_token=m("server_written_bytes_per_token"),
                bytes_per_token=m("bytes_per_token"),
                peak_rss_mib=max((r.peak_rss_mib for r in ok if r.peak_rss_mib), default=None),
                other_cpu_cores=m("other_cpu_cores"),
                slow_commits=m("slow_commits"),
                commits=m("commits"),
                errors=sum(r.errors for r in runs),
                failure=next((r.failure for r in runs if r.failure), None),
            )
        )
    return out


def _fmt(value: float | None, digits: int = 0, suffix: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}{suffix}"


_COLUMNS = (
    ("target", lambda s: s.target),
    ("C", lambda s: str(s.concurrency)),
    ("tokens/s", lambda s: _fmt(s.tokens_per_s)),
    ("spread", lambda s: _fmt(s.spread_pct, 0, "%")),
    ("ratio", lambda s: _fmt(s.ratio_to_naive, 2)),
    ("p50 ms", lambda s: _fmt(s.latency_p50_ms, 3)),
    ("p99 ms", lambda s: _fmt(s.latency_p99_ms, 2)),
    ("mid p99 ms", lambda s: _fmt(s.latency_mid_p99_ms, 2)),
    ("TTFT p50 ms", lambda s: _fmt(s.ttft_p50_ms, 1)),
    ("TTFT p99 ms", lambda s: _fmt(s.ttft_p99_ms, 1)),
    ("server µs/tok", lambda s: _fmt(s.server_cpu_us_per_token, 2)),
    ("of it sys", lambda s: _fmt(s.server_sys_us_per_token, 2)),
    ("server CPU", lambda s: _fmt(s.server_cpu_util, 2)),
    ("DB µs/tok", lambda s: _fmt(s.db_cpu_us_per_token, 2)),
    ("loadgen µs/tok", lambda s: _fmt(s.loadgen_cpu_us_per_token, 2)),
    ("loadgen CPU", lambda s: _fmt(s.loadgen_cpu_util, 2)),
    ("written B/tok", lambda s: _fmt(s.server_written_bytes_per_token, 0)),
    ("bytes/tok", lambda s: _fmt(s.bytes_per_token, 0)),
    ("peak RSS MiB", lambda s: _fmt(s.peak_rss_mib, 0)),
    ("other CPU", lambda s: _fmt(s.other_cpu_cores, 2)),
    (
        "slow commits",
        lambda s: "-" if s.commits is None else f"{_fmt(s.slow_commits)} of {_fmt(s.commits)}",
    ),
    ("errors", lambda s: s.failure[:60] if s.failure else str(s.errors)),
)


def render_table(summaries: Sequence[Summary]) -> str:
    head = "| " + " | ".join(name for name, _ in _COLUMNS) + " |"
    rule = "|" + "|".join("---" if i < 1 else "--:" for i in range(len(_COLUMNS))) + "|"
    rows = ["| " + " | ".join(get(s) for _, get in _COLUMNS) + " |" for s in summaries]
    return "\n".join([head, rule, *rows])


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:
        return None


def machine_info() -> dict[str, Any]:
    model = "?"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    rev = subprocess.run(
        ["git", "describe", "--always", "--dirty"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return {
        "code": rev or "?",
        "cpu_model": model,
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "packages": {
            name: _version(name)
            for name in ("uvicorn", "starlette", "sse-starlette", "uvloop", "httptools", "h11")
        },
        "sqlite": sqlite3.sqlite_version,
    }


def render_markdown(
    summaries: Sequence[Summary],
    config: MatrixConfig,
    command: str,
    targets: Sequence[Target],
    info: dict[str, Any],
) -> str:
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    packages = ", ".join(f"{k} {v}" for k, v in info["packages"].items() if v)
    if config.nice is not None:
        packages += f"; server and load generator at nice {config.nice}"
    pin = (
        f"server `taskset -c {config.server_cpus}`, load generator `taskset -c "
        f"{config.loadgen_cpus}`"
        if config.server_cpus is not None
        else "not pinned"
    )
    cap = f" (no new streams after {config.max_run_seconds:g} s)" if config.max_run_seconds else ""
    lines = [
        "# Benchmark results",
        "",
        f"- Date: {now}",
        f"- Machine: {info['cpu_model']}, {info['cpus']} CPUs, Linux {info['kernel']}, "
        f"Python {info['python']}; {packages}; SQLite {info['sqlite']}",
        f"- Command: `{command}` (code: `{info.get('code', '?')}`)",
        f"- Load: {config.tokens} tokens per stream"
        + (
            f" (the engine paced at {config.token_delay_ms:g} ms a token)"
            if config.token_delay_ms
            else ""
        )
        + f", about {config.total_tokens:,} tokens per "
        f"run{cap}, {config.reps} run(s) per cell"
        + (
            f" in each of {config.rounds} rounds (medians over all)"
            if config.rounds > 1
            else " (medians)"
        )
        + (
            "; open loop: Poisson arrivals, C streams a stream's duration (C in flight on "
            "average), latency of the streams after the first duration"
            if config.open_loop and config.token_delay_ms
            else ""
        )
        + ("; starts spread over a stream's duration" if config.stagger else "")
        + f", {pin}",
        "- Targets: " + "; ".join(f"**{t.name}**: {t.description}" for t in targets),
        "",
        render_table(summaries),
        "",
        "tokens/s: delta events delivered per second over all streams. ratio: tokens/s over the "
        "naive peer at the same C"
        + ("; with rounds, the median of each round's ratio" if config.rounds > 1 else "")
        + ". p50/p99: engine yield → client read of each token; mid p99: of each stream's "
        "deltas but its first and last ten. "
        "TTFT: request sent → first delta read. server µs/tok: CPU (user+sys) of the server "
        "process tree per token; of it sys: the kernel's part of that (system time); server "
        "CPU: cores used. DB µs/tok: PostgreSQL backends. "
        "written B/tok: what the server's processes wrote towards the disk per token "
        "(/proc write_bytes: WAL pages, checkpoints, token-times files). "
        "bytes/tok: database growth per token. other CPU: cores used by anything else "
        "during the run (noise). slow commits: the server's commits over "
        f"{float(SLOW_COMMIT_S) * 1000:.0f} ms during the run, of all of them (medians).",
        "",
    ]
    return "\n".join(lines)


def to_json(
    results: Sequence[RunResult],
    summaries: Sequence[Summary],
    config: MatrixConfig,
    command: str,
    info: dict[str, Any],
) -> str:
    cfg = {k: v for k, v in asdict(config).items() if k != "log"}
    return json.dumps(
        {
            "command": command,
            "machine": info,
            "config": cfg,
            "summaries": [asdict(s) for s in summaries],
            "runs": [asdict(r) for r in results],
        },
        indent=1,
        default=_path_text,  # the config's folders (workdir_root, profile_dir)
    )


def _path_text(value: object) -> str:
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
