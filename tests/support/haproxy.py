"""A real HAProxy in front of server processes, for the replica tests and benchmark (issue 15).

Each :class:`Balancer` is a ``haproxy`` process of its own (never the system service the Debian
package may start), with a configuration it writes into the test's directory:

    balancer = Balancer(tmp_path, [("r0", 8101), ("r1", 8102), ("r2", 8103)])
    balancer.url                          # http://127.0.0.1:<free port>
    balancer.wait_servers({"r0": "UP", "r1": "UP", "r2": "UP"})
    balancer.stop()

The configuration is what a deployment of several replicas needs, and each line is there for a
behaviour the tests rely on:

* round robin and no stickiness: any replica may get any request, including the resume of a
  stream another replica started;
* ``option httpchk`` sending ``GET /health/ready`` (HTTP/1.1, with a Host) every ``inter 200ms fall 1 rise 1``: a replica that is
  starting, draining or dead leaves the rotation within a check, and a restarted one rejoins;
* ``timeout server``/``timeout tunnel`` of a minute: a server-sent-events stream is one long
  response that HAProxy must not cut while tokens trickle in;
* ``retry-on 503 conn-failure empty-response`` with ``retries 3`` and ``option redispatch 1``
  (every retry goes to another server): a POST that reaches a draining replica (503) or a dead
  one (refused, or closed without an answer) is replayed on another replica. HAProxy can replay
  only a request it holds whole, so ``http-request wait-for-body`` buffers request bodies first
  (the 2.6 docs: anything beyond ``conn-failure`` needs the request in one buffer, and a
  request bigger than ``tune.bufsize`` is never retried; the tests' bodies are small).

``wait_servers`` reads the servers' check states from the admin socket (``show stat``), so a
test can wait until HAProxy itself sees a replica up or down instead of guessing a delay.
"""

from __future__ import annotations

import csv
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.support.server import free_port

__all__ = ["Balancer", "BalancerDidNotStart", "haproxy_command", "unavailable"]

#: The readiness probe HAProxy sends every replica.
HEALTH_PATH = "/health/ready"


class BalancerDidNotStart(AssertionError):
    pass


def haproxy_command() -> str | None:
    """The ``haproxy`` executable (Debian puts it in /usr/sbin, often not on a user's PATH)."""
    return shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")


def unavailable() -> str | None:
    """None if HAProxy is installed; otherwise why the tests that need it skip."""
    if haproxy_command() is None:
        return "haproxy is not installed (scripts/install-haproxy.sh installs Debian's package)"
    return None


def config(
    port: int,
    servers: Sequence[tuple[str, int]],
    admin_socket: Path,
    *,
    health_path: str = HEALTH_PATH,
    stream_timeout_s: float = 60,
) -> str:
    """The haproxy.cfg for ``servers`` (name, port on 127.0.0.1) behind 127.0.0.1:``port``."""
    timeout = f"{int(stream_timeout_s * 1000)}ms"
    lines = [
        "global",
        "    maxconn 4096",
        f"    stats socket {admin_socket} mode 600 level admin",
        "    log stdout format raw local0 info",
        "",
        "defaults",
        "    mode http",
        "    log global",
        "    option httplog",
        "    option log-health-checks",
        "    maxconn 4000",
        "    timeout connect 1s",
        f"    timeout client {timeout}",
        f"    timeout server {timeout}",
        f"    timeout tunnel {timeout}",
        "    timeout http-request 10s",
        "    timeout http-keep-alive 5s",
        "    timeout check 1s",
        "",
        "frontend replicas_in",
        f"    bind 127.0.0.1:{port}",
        "    default_backend replicas",
        "",
        "backend replicas",
        "    balance roundrobin",
        # HTTP/1.1 with a Host header: the server refuses (400) a request without one.
        "    option httpchk",
        f"    http-check send meth GET uri {health_path} ver HTTP/1.1 hdr Host 127.0.0.1",
        "    http-check expect status 200",
        "    http-request wait-for-body time 2s",
        "    retry-on 503 conn-failure empty-response",
        "    retries 3",
        "    option redispatch 1",
    ]
    lines += [
        f"    server {name} 127.0.0.1:{server_port} check inter 200ms fall 1 rise 1"
        for name, server_port in servers
    ]
    return "\n".join(lines) + "\n"


class Balancer:
    def __init__(
        self,
        workdir: Path,
        servers: Sequence[tuple[str, int]],
        *,
        health_path: str = HEALTH_PATH,
        start_timeout_s: float = 15,
    ) -> None:
        command = haproxy_command()
        if command is None:
            raise BalancerDidNotStart(unavailable() or "no haproxy")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.servers = list(servers)
        # A unix socket path must stay under ~107 bytes; pytest's tmp_path can be longer.
        self.admin_socket = Path(f"/tmp/haproxy-{os.getpid()}-{self.port}.sock")
        self.config_path = workdir / "haproxy.cfg"
        self.config_path.write_text(
            config(self.port, self.servers, self.admin_socket, health_path=health_path)
        )
        check = subprocess.run(
            [command, "-c", "-f", str(self.config_path)],
            capture_output=True,
            text=True,
            check=False,
        )
        if check.returncode != 0:
            raise BalancerDidNotStart(
                f"haproxy refused its configuration:\n{check.stdout}{check.stderr}"
            )
        self.log = workdir / "haproxy.log"
        with self.log.open("wb") as out:
            # -db: stay in the foreground, so the process is the one to stop.
            self.proc = subprocess.Popen(
                [command, "-db", "-f", str(self.config_path)], stdout=out, stderr=subprocess.STDOUT
            )
        try:
            self._wait_listening(start_timeout_s)
        except BaseException:
            self.stop()
            raise

    def _wait_listening(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise BalancerDidNotStart(
                    f"haproxy exited ({self.proc.returncode}):\n{self.log_text()}"
                )
            if self.admin_socket.exists():
                try:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                        return
                except OSError:
                    pass
            if time.monotonic() > deadline:
                raise BalancerDidNotStart(
                    f"haproxy did not listen within {timeout_s} s:\n{self.log_text()}"
                )
            time.sleep(0.05)

    def admin(self, command: str) -> str:
        """One command on the admin socket; its answer."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(self.admin_socket))
            sock.sendall(command.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")

    def server_states(self) -> dict[str, tuple[str, str]]:
        """Server name -> (status, last check) as HAProxy sees it: ``("UP", "L7OK")``,
        ``("DOWN", "L7STS")`` (the probe answered, not 200), ``("DOWN", "L4CON")`` (refused)."""
        text = self.admin("show stat").lstrip("# ")
        states = {}
        for row in csv.DictReader(text.splitlines()):
            if row.get("pxname") == "replicas" and row.get("svname") not in ("FRONTEND", "BACKEND"):
                states[row["svname"]] = (row["status"], row.get("check_status", ""))
        return states

    def wait_servers(self, expected: Mapping[str, str], timeout_s: float = 30) -> None:
        """Wait until each named server's status starts with the expected one (``UP``/``DOWN``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            states = self.server_states()
            if all(
                states.get(name, ("?", ""))[0].startswith(want) for name, want in expected.items()
            ):
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"HAProxy did not see {dict(expected)} within {timeout_s} s; it sees {states} "
                    f"(the probe is GET {self.health_probe()})"
                )
            time.sleep(0.05)

    def health_probe(self) -> str:
        for line in self.config_path.read_text().splitlines():
            if "http-check send" in line:
                return line.split()[5]
        return "?"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.admin_socket.unlink(missing_ok=True)

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""
