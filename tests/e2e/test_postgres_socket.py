"""A server on PostgreSQL over a Unix socket (``?host=/path/to/socket/dir``), as a database on
the same machine is often reached.

The socket's directory in the URL is percent-escaped (``%2F``), and Alembic's configparser took
"%" for an interpolation: the server could not start on such a URL (``persistence.migrate``).
Here a real ``responses-ledger serve`` migrates over the socket, streams a response through the
OpenAI SDK, and a follower of a background response is woken by the doorbell, whose LISTEN
connection goes over the same socket. The cluster is one of the test's own (its socket is in its
own directory), so the shared one is not touched.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from tests.e2e.conftest import harmony
from tests.support.pg_cluster import DATABASE, PgCluster, own_cluster
from tests.support.process import ServerProcess

MODEL = "gpt-oss-socket"
WORDS = " ".join(f"word{i}" for i in range(40))


@pytest.fixture(scope="module")
def cluster() -> Iterator[PgCluster]:
    with own_cluster() as made:
        yield made


def test_a_server_over_a_unix_socket_migrates_streams_and_follows(
    cluster: PgCluster, tmp_path: Path
) -> None:
    sockets = list(cluster.root.glob(".s.PGSQL.*"))
    assert sockets, "the cluster has no Unix socket"
    url = f"postgresql+asyncpg://postgres@/{DATABASE}?host={cluster.root}&port={cluster.port}"
    turns = [
        {"completion": harmony(("final", "Over the socket."))},
        {"completion": harmony(("final", WORDS)), "token_delay_ms": 20},
    ]
    server = ServerProcess(tmp_path, "socket", url, {"turns": turns}, model=MODEL, log_level="info")
    try:
        client = OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
        with client.responses.stream(model=MODEL, input="hi") as stream:
            final = stream.get_final_response()
        assert final.status == "completed" and final.output_text == "Over the socket."
        assert client.responses.retrieve(final.id).output_text == "Over the socket."

        # a background response followed from its first event: each batch reaches the
        # follower through the doorbell (LISTEN over the socket) or its poll
        started = client.responses.create(model=MODEL, input="more", background=True)
        text = ""
        with client.responses.retrieve(started.id, stream=True) as events:
            for event in events:
                if event.type == "response.output_text.delta":
                    text += event.delta
                if event.type == "response.completed":
                    break
        assert text == WORDS
        health = httpx.get(f"{server.base_url}/health", timeout=10).json()
        assert health["status"] == "ok", health
        log = server.log_text()
        assert "doorbell: listening" in log, log  # its LISTEN connection, over the socket
        assert "doorbell: listening connection failed" not in log, log
    finally:
        server.stop()
