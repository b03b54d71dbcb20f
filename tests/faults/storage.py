"""SQLite faults: a tiny tmpfs that can be filled or made read-only, and a write lock held by
another process.

We run as root, so file permissions do not stop writes: a read-only store has to be a
read-only *mount* (``mount -o remount,ro``), and a full disk a filesystem of its own that a
filler file can exhaust (a tmpfs of a few MiB). Both need ``mount``; :func:`mount_unavailable`
says why it cannot be used here, so a fixture can skip with that reason.

    with Tmpfs("16m") as disk:            # mounted at disk.path, unmounted afterwards
        disk.fill()                       # ENOSPC for every later write
        disk.free()
        disk.readonly(); disk.writable()

    with WriteLock(db_path):              # BEGIN IMMEDIATE in a sqlite3 connection of another
        ...                               # process: every writer waits, then gets SQLITE_BUSY
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import TracebackType

__all__ = ["Tmpfs", "WriteLock", "mount_unavailable"]

_mount_reason: str | None = None
_mount_checked = False


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)


def mount_unavailable() -> str | None:
    """None if a tmpfs can be mounted (and remounted read-only) here; otherwise why not."""
    global _mount_reason, _mount_checked
    if _mount_checked:
        return _mount_reason
    _mount_checked = True
    if shutil.which("mount") is None or shutil.which("umount") is None:
        _mount_reason = "mount/umount are not installed"
        return _mount_reason
    if os.geteuid() != 0:
        _mount_reason = "mounting a tmpfs needs root"
        return _mount_reason
    probe = tempfile.mkdtemp(prefix="ledger-mount-probe-")
    try:
        result = _run("mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", probe)
        if result.returncode != 0:
            _mount_reason = f"mount -t tmpfs is not permitted here: {result.stderr.strip()}"
            return _mount_reason
        result = _run("mount", "-o", "remount,ro", probe)
        if result.returncode != 0:
            _mount_reason = f"mount -o remount,ro is not permitted here: {result.stderr.strip()}"
        _run("umount", probe)
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(probe)
    return _mount_reason


class Tmpfs:
    """A tmpfs of ``size`` (mount's syntax: ``16m``) mounted on a new directory under /tmp."""

    FILLER = ".filler"

    def __init__(self, size: str = "16m") -> None:
        self.size = size
        self.path = Path(tempfile.mkdtemp(prefix="ledger-tmpfs-"))
        result = _run(
            "mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(self.path)
        )
        if result.returncode != 0:
            os.rmdir(self.path)
            raise OSError(f"mount -t tmpfs failed: {result.stderr.strip()}")
        self.mounted = True

    def __enter__(self) -> Tmpfs:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.unmount()

    @property
    def filler(self) -> Path:
        return self.path / self.FILLER

    def fill(self) -> int:
        """Write a filler file until the filesystem is full (ENOSPC); the bytes written."""
        written = 0
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            for chunk in (1 << 20, 1 << 12, 1):
                block = b"\0" * chunk
                while True:
                    try:
                        written += os.write(fd, block)
                    except OSError as exc:
                        if exc.errno != errno.ENOSPC:
                            raise
                        break
        finally:
            os.close(fd)
        return written

    def free(self) -> None:
        """Remove the filler file."""
        with contextlib.suppress(FileNotFoundError):
            self.filler.unlink()

    def free_bytes(self) -> int:
        stat = os.statvfs(self.path)
        return stat.f_bavail * stat.f_frsize

    def readonly(self) -> None:
        result = _run("mount", "-o", "remount,ro", str(self.path))
        if result.returncode != 0:
            raise OSError(f"remount,ro failed: {result.stderr.strip()}")

    def writable(self) -> None:
        result = _run("mount", "-o", "remount,rw", str(self.path))
        if result.returncode != 0:
            raise OSError(f"remount,rw failed: {result.stderr.strip()}")

    def unmount(self) -> None:
        if not self.mounted:
            return
        result = _run("umount", str(self.path))
        if result.returncode != 0:  # still in use (a process that outlived its test): detach it
            _run("umount", "-l", str(self.path))
        self.mounted = False
        with contextlib.suppress(OSError):
            os.rmdir(self.path)


_HOLDER = r"""
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], timeout=60, isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.read()  # until the test closes our stdin
conn.execute("ROLLBACK")
conn.close()
print("released", flush=True)
"""


class WriteLock:
    """Another process's sqlite3 connection in ``BEGIN IMMEDIATE`` on ``db``: it holds the
    database's write lock (in WAL mode: the WAL write lock) until :meth:`release`. Readers are
    not blocked; every writer waits out its busy timeout and then fails with SQLITE_BUSY."""

    def __init__(self, db: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(db)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if line != "locked":
            self.proc.kill()
            _, err = self.proc.communicate(timeout=10)
            raise RuntimeError(f"the lock holder could not take the write lock: {err}")
        self.held = True

    def __enter__(self) -> WriteLock:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        try:
            self.proc.communicate(input="", timeout=30)  # EOF on its stdin: it rolls back
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate(timeout=10)
