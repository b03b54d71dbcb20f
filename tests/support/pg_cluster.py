"""A PostgreSQL cluster of the test's own, for fault tests that restart, stop and freeze it.

The shared cluster on 127.0.0.1:5432 serves every other test and must never be stopped, so a
test that takes the database away mid-stream gets a cluster of its own: ``initdb`` into a
temporary data directory, trust auth, its own free port on 127.0.0.1, its unix socket in that
directory, fsync on (an outage test on a cluster that does not sync would prove little), small
shared_buffers.

PostgreSQL refuses to run as root, and the tests run as root, so every PostgreSQL binary runs as
the ``postgres`` OS user (``runuser -u postgres --``) on a directory that user owns.

    cluster = PgCluster.create()          # initdb + start: a few seconds
    cluster.url                           # postgresql+asyncpg://... of database "ledger"
    cluster.restart(downtime_s=3)         # fast stop, 3 s down, start
    cluster.stop("immediate"); cluster.start()
    cluster.freeze(); ...; cluster.thaw()  # SIGSTOP / SIGCONT the postmaster and its children
    cluster.reset_database()              # a fresh, empty "ledger" database for the next test
    cluster.destroy()

``freeze`` stops the postmaster and every backend and auxiliary process it forked (found as the
postmaster's children, so nothing of the shared cluster can be hit): connections then hang
instead of failing, the way a stalled disk or a paused VM looks to a client.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

__all__ = ["PgCluster", "own_cluster", "unavailable"]

BIN = Path("/usr/lib/postgresql/15/bin")
USER = "postgres"
DATABASE = "ledger"


def unavailable() -> str | None:
    """None if a cluster of our own can be made here; otherwise why not (for a skip)."""
    if not (BIN / "initdb").exists():
        return f"PostgreSQL binaries are not in {BIN}"
    try:
        pwd.getpwnam(USER)
    except KeyError:
        return f"there is no {USER!r} OS user to run PostgreSQL as"
    if os.geteuid() != 0:
        return "starting PostgreSQL as the postgres user needs root (runuser)"
    if shutil.which("runuser") is None:
        return "runuser is not installed"
    return None


@contextlib.contextmanager
def own_cluster() -> Iterator[PgCluster]:
    """A cluster of the caller's own for the ``with`` block (destroyed after), or a pytest skip
    that says why this machine cannot make one."""
    import pytest  # (this module also serves scripts that have no pytest session)

    reason = unavailable()
    if reason is not None:
        pytest.skip(f"no PostgreSQL cluster of our own: {reason}")
    cluster = PgCluster.create()
    try:
        yield cluster
    finally:
        cluster.destroy()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PgCluster:
    """One cluster in a temporary directory, owned by the ``postgres`` OS user."""

    def __init__(self, root: Path, port: int) -> None:
        self.root = root
        self.data = root / "data"
        self.logfile = root / "postgres.log"
        self.port = port
        self._frozen: list[psutil.Process] = []

    @classmethod
    def create(cls, *, shared_buffers: str = "16MB", max_connections: int = 60) -> PgCluster:
        """initdb, configure and start a new cluster."""
        reason = unavailable()
        if reason is not None:
            raise RuntimeError(reason)
        # /tmp, not pytest's tmp_path: the postgres user must be able to reach the directory,
        # and pytest's temporary directories are private to root.
        root = Path(tempfile.mkdtemp(prefix="ledger-pg-"))
        entry = pwd.getpwnam(USER)
        os.chown(root, entry.pw_uid, entry.pw_gid)
        cluster = cls(root, _free_port())
        try:
            cluster._as_postgres(
                str(BIN / "initdb"),
                "-D",
                str(cluster.data),
                "-A",
                "trust",
                "-U",
                USER,
                "-E",
                "UTF8",
                "--no-sync",  # initdb's own files; the running cluster syncs
            )
            conf = cluster.data / "postgresql.conf"
            with conf.open("a") as out:
                out.write(
                    "\n# tests/support/pg_cluster.py\n"
                    f"port = {cluster.port}\n"
                    "listen_addresses = '127.0.0.1'\n"
                    f"unix_socket_directories = '{root}'\n"
                    f"shared_buffers = {shared_buffers}\n"
                    f"max_connections = {max_connections}\n"
                    "fsync = on\n"
                    "synchronous_commit = on\n"
                    "full_page_writes = on\n"
                    "logging_collector = off\n"
                )
            cluster.start()
            cluster._psql(f'CREATE DATABASE "{DATABASE}"')
        except BaseException:
            cluster.destroy()
            raise
        return cluster

    # -- addresses -------------------------------------------------------------------------

    @property
    def dsn(self) -> str:
        """A libpq/asyncpg DSN of the ``ledger`` database."""
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{DATABASE}"

    @property
    def url(self) -> str:
        """The SQLAlchemy URL of the ``ledger`` database (what the server is given)."""
        return f"postgresql+asyncpg://{USER}@127.0.0.1:{self.port}/{DATABASE}"

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, timeout_s: float = 60) -> None:
        self._as_postgres(
            str(BIN / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.logfile),
            "-w",
            "-t",
            str(int(timeout_s)),
            "start",
        )

    def stop(self, mode: str = "fast", timeout_s: float = 60) -> None:
        """``fast``: roll back and disconnect every session, checkpoint, exit.
        ``immediate``: exit at once (crash recovery at the next start)."""
        if mode not in ("fast", "immediate", "smart"):
            raise ValueError(f"unknown stop mode {mode!r}")
        self.thaw()  # a frozen postmaster cannot stop
        self._as_postgres(
            str(BIN / "pg_ctl"),
            "-D",
            str(self.data),
            "-m",
            mode,
            "-w",
            "-t",
            str(int(timeout_s)),
            "stop",
        )

    def restart(self, mode: str = "fast", downtime_s: float = 0.0) -> None:
        """Stop, stay down ``downtime_s``, start again (same port, same data)."""
        self.stop(mode)
        if downtime_s > 0:
            time.sleep(downtime_s)
        self.start()

    @property
    def running(self) -> bool:
        return self.postmaster_pid() is not None

    def postmaster_pid(self) -> int | None:
        pidfile = self.data / "postmaster.pid"
        try:
            pid = int(pidfile.read_text().split("\n", 1)[0])
        except (FileNotFoundError, ValueError):
            return None
        return pid if psutil.pid_exists(pid) else None

    def processes(self) -> list[psutil.Process]:
        """The postmaster, then every process it forked (backends, checkpointer, walwriter, ...)."""
        pid = self.postmaster_pid()
        if pid is None:
            return []
        postmaster = psutil.Process(pid)
        return [postmaster, *postmaster.children(recursive=True)]

    def freeze(self) -> None:
        """SIGSTOP the postmaster first (so it forks nothing new), then each of its children."""
        if self._frozen:
            return
        procs = self.processes()
        if not procs:
            raise RuntimeError("the cluster is not running")
        procs[0].send_signal(signal.SIGSTOP)
        children = procs[0].children(recursive=True)  # the postmaster can no longer fork
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.send_signal(signal.SIGSTOP)
        self._frozen = [procs[0], *children]

    def thaw(self) -> None:
        """SIGCONT the children first, then the postmaster (the reverse of freeze)."""
        frozen, self._frozen = self._frozen, []
        for proc in reversed(frozen):
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(signal.SIGCONT)

    @property
    def frozen(self) -> bool:
        return bool(self._frozen)

    @contextlib.contextmanager
    def frozen_for(self) -> Iterator[None]:
        """Frozen inside the block, thawed after it whatever happens."""
        self.freeze()
        try:
            yield
        finally:
            self.thaw()

    def reset_database(self) -> None:
        """Drop the ``ledger`` database (with every connection to it) and create it empty."""
        if not self.running:
            self.start()
        self.thaw()
        self._psql(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
        self._psql(f'CREATE DATABASE "{DATABASE}"')

    def destroy(self) -> None:
        """Stop the cluster (immediately) and remove its directory."""
        self.thaw()
        if self.running:
            with contextlib.suppress(subprocess.CalledProcessError):
                self.stop("immediate")
        pid = self.postmaster_pid()
        if pid is not None:  # pg_ctl gave up: end what is left of our own cluster
            for proc in self.processes():
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.kill()
        shutil.rmtree(self.root, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    # -- helpers ---------------------------------------------------------------------------

    def _psql(self, sql: str) -> str:
        return self._as_postgres(
            str(BIN / "psql"),
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            str(self.root),
            "-p",
            str(self.port),
            "-U",
            USER,
            "-d",
            "postgres",
            "-c",
            sql,
        )

    def _as_postgres(self, *argv: str) -> str:
        result = subprocess.run(
            ["runuser", "-u", USER, "--", *argv],
            cwd=self.root,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if result.returncode != 0:
            raise subprocess.CalledProcessError(
                result.returncode,
                argv,
                output=result.stdout,
                stderr=f"{result.stderr}\n--- postgres log ---\n{self.log_tail()}",
            )
        return result.stdout
