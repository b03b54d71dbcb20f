"""Issue 14, points 6 and 7: slow or stalled clients harm nobody else (``app.transport``).

A real server (in-process, both of uvicorn's parsers) with small bounds, driven over raw sockets:
a live stream whose client stops reading is closed once ``send_buffer_bytes`` are queued for it
and its response is still completed and stored; a replay whose client stops reading is closed
after ``send_stall_s``; a slow request head is cut after ``http_header_timeout_s`` (408); an
oversized head gets 431; with the connection cap reached by connections that never finish their
head, a normal request still succeeds (the longest-waiting one makes room), and when every
connection is busy the new one gets 503; an idle keep-alive connection is closed after
``http_keep_alive_s``.
"""

from __future__ import annotations

import contextlib
import gc
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.encoding import load_encoding
from app.engines.scripted import ScriptedEngine
from app.settings import Settings
from tests.e2e.conftest import harmony, sse_events
from tests.support.server import RunningServer, serve

MODEL = "gpt-oss-transport"
#: ~40k tokens: a stream of several MB, far more than the send bound plus the kernel's buffers.
WORDS = " ".join(f"word{i}" for i in range(12_000))
BIG = {"completion": harmony(("final", WORDS))}
SEND_BUFFER = 64 * 1024
STALL_S = 2.0  # long enough that a loaded machine does not mistake the send-buffer cut for it
HEADER_TIMEOUT_S = 0.5
KEEP_ALIVE_S = 0.5
MAX_HEAD = 8 * 1024
CAP = 6


def _settings(tmp: Path, impl: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = dict(
        engine="scripted",
        database_url=f"sqlite+aiosqlite:///{tmp / 'responses.db'}",
        served_model_names=(MODEL,),
        http_implementation=impl,
        http_header_timeout_s=HEADER_TIMEOUT_S,
        http_keep_alive_s=KEEP_ALIVE_S,
        http_max_head_bytes=MAX_HEAD,
        send_buffer_bytes=SEND_BUFFER,
        send_stall_s=STALL_S,
        # a delta a token (the default, pinned): these tests need a long stream of small writes,
        # which an unpaced engine's coalesced deltas (a few, each of thousands of tokens) are not
        coalesce_deltas=False,
    )
    values.update(overrides)
    return Settings(**values)


@pytest.fixture(scope="module", params=["h11", "httptools"])
def impl(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def engine() -> ScriptedEngine:
    return ScriptedEngine(load_encoding(), [MODEL], {"turns": []})


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, impl: str, engine: ScriptedEngine
) -> Iterator[RunningServer]:
    with serve(_settings(tmp_path_factory.mktemp("transport"), impl), engine=engine) as running:
        yield running


@pytest.fixture(scope="module")
def capped(
    tmp_path_factory: pytest.TempPathFactory, impl: str, engine: ScriptedEngine
) -> Iterator[RunningServer]:
    """The cap's own server: heads may take long here, so only the cap closes them."""
    settings = _settings(
        tmp_path_factory.mktemp("capped"),
        impl,
        http_max_connections=CAP,
        http_header_timeout_s=60.0,
    )
    with serve(settings, engine=engine) as running:
        yield running


def _connect(server: RunningServer, *, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket()
    try:
        if rcvbuf is not None:  # before connecting, so the window stays small
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.settimeout(10)
        sock.connect(("127.0.0.1", int(server.base_url.rsplit(":", 1)[1])))
    except BaseException:
        sock.close()
        raise
    return sock


@pytest.fixture(autouse=True)
def _collect_after_each_test() -> Iterator[None]:
    """A socket left unclosed (by a test or by the server) warns when it is collected, wherever
    the collector happens to run: once during a later test of a clean-clone CI run, which could not
    say whose it was. Collecting after each test puts such a warning on the test that made it."""
    yield
    gc.collect()


def _post(path: str, body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    ).encode() + data


def _read_rest(sock: socket.socket, timeout: float) -> tuple[bytes, str]:
    """Everything the server still sends, and how the connection ended: ``eof``, ``reset``, or
    ``open`` (nothing for ``timeout`` seconds)."""
    sock.settimeout(timeout)
    chunks = []
    while True:
        try:
            chunk = sock.recv(1 << 20)
        except TimeoutError:
            return b"".join(chunks), "open"
        except ConnectionResetError:
            return b"".join(chunks), "reset"
        if not chunk:
            return b"".join(chunks), "eof"
        chunks.append(chunk)


def _response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    assert raw, "no answer"
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {
        k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])
    }
    return status, headers, body


def _error_code(raw: bytes, status: int) -> str:
    got, headers, body = _response(raw)
    assert got == status, raw[:500]
    assert headers["connection"] == "close"
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return str(error["code"])


def _wait_stored(server: RunningServer, response_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while True:
        body = httpx.get(f"{server.base_url}/v1/responses/{response_id}", timeout=30).json()
        if body["status"] != "in_progress":
            return dict(body)
        assert time.monotonic() < deadline, "the response did not finish"
        time.sleep(0.2)


def _first_event(raw: bytes, kind: str) -> dict[str, Any] | None:
    """The first ``kind`` event of a raw HTTP stream read so far, or None while it is not all in
    (a loaded machine may hand it over in several reads, cut anywhere)."""
    for event in _complete_events(raw.partition(b"\r\n\r\n")[2]):
        if event.get("type") == kind:
            return event
    return None


def _complete_events(body: bytes) -> list[dict[str, Any]]:
    try:
        return sse_events(body)
    except ValueError:  # the last event is cut off: parse only up to the last frame's end
        end = max(body.rfind(b"\n\n"), body.rfind(b"\r\n\r\n"))
        if end < 0:
            return []
        try:
            return sse_events(body[: end + 2])
        except ValueError:
            return []


def _stats(server: RunningServer) -> Any:
    return server.server.stats  # type: ignore[attr-defined]


def test_stalled_live_stream_is_closed_past_the_send_buffer_and_its_response_is_stored(
    server: RunningServer, engine: ScriptedEngine
) -> None:
    cuts = _stats(server).cut_send_buffer
    engine.add_turns(BIG)
    sock = _connect(server, rcvbuf=4096)
    with sock:
        sock.sendall(_post("/v1/responses", {"model": MODEL, "input": "go", "stream": True}))
        first = b""
        created = None
        while created is None:  # read until the whole response.created event is in
            chunk = sock.recv(4096)
            assert chunk, first[:500]  # the server answered without a stream
            first += chunk
            created = _first_event(first, "response.created")
        response_id = created["response"]["id"]
        # ... and the client reads no more. The response is generated and stored all the same:
        final = _wait_stored(server, response_id)
        assert final["status"] == "completed"
        assert final["output"][0]["content"][0]["text"] == WORDS
        # while the stream was closed once SEND_BUFFER bytes were queued for it: what it still
        # gets is a part of the stream, never its end
        rest, ended = _read_rest(sock, timeout=10)
    assert ended in ("eof", "reset")
    assert b"response.completed" not in first + rest
    assert _stats(server).cut_send_buffer == cuts + 1, _stats(server)


def _dechunk(body: bytes) -> tuple[bytes, bool]:
    """The payload of a chunked body, strictly framed (every size line, every CRLF), and
    whether its last chunk has arrived."""
    out, pos = [], 0
    while pos < len(body):
        line_end = body.index(b"\r\n", pos)
        size = int(body[pos:line_end], 16)
        start = line_end + 2
        if size == 0:
            assert body[start:] == b"\r\n", body[start:][:100]
            return b"".join(out), True
        assert body[start + size : start + size + 2] == b"\r\n", "a chunk's size line is wrong"
        out.append(body[start : start + size])
        pos = start + size + 2
    return b"".join(out), False


def test_a_paced_live_stream_is_written_from_its_commits_byte_for_byte(
    server: RunningServer, engine: ScriptedEngine
) -> None:
    """After its first batch, a live stream's frames are written by the commits that make them
    durable (``transport.body_writer``), not sent through ASGI: on both parsers the wire is
    well-formed chunked HTTP, and its bytes are exactly the stored log's replay."""
    words = " ".join(f"w{i}" for i in range(60))
    engine.add_turns({"completion": harmony(("final", words)), "token_delay_ms": 2})
    direct = _stats(server).written_direct
    with _connect(server) as sock:
        sock.sendall(_post("/v1/responses", {"model": MODEL, "input": "go", "stream": True}))
        raw, done = b"", False
        while not done:
            chunk = sock.recv(1 << 16)
            assert chunk, raw[-300:]
            raw += chunk
            if b"\r\n\r\n" in raw:
                status, headers, body = _response(raw)
                assert status == 200 and headers["transfer-encoding"] == "chunked"
                live, done = _dechunk(body)
    events = sse_events(live)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == "response.completed"
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == words
    assert _stats(server).written_direct == direct + 1
    response_id = events[0]["response"]["id"]
    replay = httpx.get(
        f"{server.base_url}/v1/responses/{response_id}", params={"stream": "true"}, timeout=30
    )
    assert replay.content == live


def test_stalled_replay_is_closed_after_the_stall_time(
    server: RunningServer, engine: ScriptedEngine
) -> None:
    engine.add_turns(BIG)
    done = httpx.post(
        f"{server.base_url}/v1/responses", json={"model": MODEL, "input": "go"}, timeout=120
    )
    assert done.status_code == 200 and done.json()["status"] == "completed"
    cuts = _stats(server).cut_stalled
    sock = _connect(server, rcvbuf=4096)
    with sock:
        sock.sendall(
            f"GET /v1/responses/{done.json()['id']}?stream=true HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
        )
        first = sock.recv(4096)
        assert first.startswith(b"HTTP/1.1 200")
        time.sleep(STALL_S + 2)  # not reading: a replay waits for its client, up to STALL_S
        rest, ended = _read_rest(sock, timeout=10)
    assert ended in ("eof", "reset")
    assert b"response.completed" not in first + rest
    assert _stats(server).cut_stalled == cuts + 1, _stats(server)


def test_slow_request_head_is_cut_after_the_header_timeout(server: RunningServer) -> None:
    sock = _connect(server)
    with sock:
        start = time.monotonic()
        with contextlib.suppress(OSError):
            for byte in b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 100:
                sock.send(bytes([byte]))  # one byte each 0.05 s: the head takes 6 s
                time.sleep(0.05)
                if time.monotonic() - start > 4:
                    break
        raw, ended = _read_rest(sock, timeout=3)
        elapsed = time.monotonic() - start
    assert _error_code(raw, 408) == "request_timeout"
    assert ended == "eof"
    assert elapsed < HEADER_TIMEOUT_S + 3.5

    # a connection that sends nothing is closed after the same time, without an answer
    with _connect(server) as silent:
        start = time.monotonic()
        raw, ended = _read_rest(silent, timeout=5)
        assert (raw, ended) == (b"", "eof")
        assert time.monotonic() - start < HEADER_TIMEOUT_S + 3


def test_oversized_request_head_is_refused(server: RunningServer) -> None:
    def head(size: int) -> bytes:
        return f"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: {'a' * size}\r\n\r\n".encode()

    with _connect(server) as sock:
        sock.sendall(head(MAX_HEAD - 200))
        raw, _ = _read_rest(sock, timeout=1)
        assert _response(raw)[0] == 200  # under the limit: served

    for size in (MAX_HEAD + 1, 4 << 20):  # just over; and 4 MiB, still being sent as we answer
        with _connect(server) as sock:
            with contextlib.suppress(OSError):
                sock.sendall(head(size))
            raw, ended = _read_rest(sock, timeout=5)
        assert _error_code(raw, 431) == "request_header_fields_too_large"
        assert ended == "eof"


def test_idle_keep_alive_connection_is_closed(server: RunningServer) -> None:
    with _connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        start = time.monotonic()
        raw, ended = _read_rest(sock, timeout=4)
    status, _, body = _response(raw)
    assert status == 200 and json.loads(body) == {"status": "ok"}
    assert ended == "eof"
    # (asyncio may run a timer up to its clock's resolution early; uvicorn's default is 5 s)
    assert KEEP_ALIVE_S * 0.9 <= time.monotonic() - start < KEEP_ALIVE_S + 3


def test_connection_cap_full_of_slow_heads_still_serves_a_request(capped: RunningServer) -> None:
    evicted = _stats(capped).evicted
    slow = []
    try:
        for _ in range(CAP):
            sock = _connect(capped)
            slow.append(sock)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the rest
            time.sleep(0.05)  # the first is the longest-waiting
        resp = httpx.get(capped.base_url + "/health", timeout=10, headers={"Connection": "close"})
        assert resp.status_code == 200
        assert _read_rest(slow[0], timeout=3) == (b"", "eof")  # it made room
        for sock in slow[
            2:
        ]:  # the rest are still open (the second may have made room for httpx's close)
            sock.setblocking(False)
            with pytest.raises(BlockingIOError):
                sock.recv(1)
        assert _stats(capped).evicted >= evicted + 1
    finally:
        for sock in slow:
            sock.close()


def test_connection_cap_makes_room_with_an_answered_connection_first(capped: RunningServer) -> None:
    with _connect(capped) as answered:  # 431, then read and discarded for a moment before the close
        answered.sendall(b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * (MAX_HEAD + 1) + b"\r\n\r\n")
        raw, ended = _read_rest(answered, timeout=5)
        assert _response(raw)[0] == 431 and ended == "eof"
        slow = []
        try:
            for _ in range(CAP - 1):
                sock = _connect(capped)
                slow.append(sock)
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            resp = httpx.get(
                capped.base_url + "/health", timeout=10, headers={"Connection": "close"}
            )
            assert resp.status_code == 200
            for sock in slow:  # the answered connection made room, not the longest-waiting head
                sock.setblocking(False)
                with pytest.raises(BlockingIOError):
                    sock.recv(1)
        finally:
            for sock in slow:
                sock.close()


def test_connection_cap_full_of_requests_refuses_a_new_connection(
    capped: RunningServer, engine: ScriptedEngine
) -> None:
    refused = _stats(capped).refused
    engine.add_turns(
        *[{"completion": harmony(("final", "slow " * 60)), "token_delay_ms": 50}] * CAP
    )
    busy = []
    try:
        for _ in range(CAP):  # every connection streams a response of ~3 s
            sock = _connect(capped)
            busy.append(sock)
            sock.sendall(_post("/v1/responses", {"model": MODEL, "input": "go", "stream": True}))
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        with _connect(capped) as extra:
            raw, ended = _read_rest(extra, timeout=5)
        assert _error_code(raw, 503) == "too_many_connections"
        assert _response(raw)[1]["retry-after"] == "1"
        assert ended == "eof"
        assert _stats(capped).refused == refused + 1
    finally:
        for sock in busy:
            sock.close()


def test_transport_settings_come_from_the_environment() -> None:
    settings = Settings.from_env(
        {
            "RESPONSES_LEDGER_HTTP_HEADER_TIMEOUT_S": "2.5",
            "RESPONSES_LEDGER_HTTP_KEEP_ALIVE_S": "7",
            "RESPONSES_LEDGER_HTTP_MAX_HEAD_BYTES": "1024",
            "RESPONSES_LEDGER_HTTP_MAX_CONNECTIONS": "99",
            "RESPONSES_LEDGER_HTTP_IMPLEMENTATION": "h11",
            "RESPONSES_LEDGER_SEND_BUFFER_BYTES": "4096",
            "RESPONSES_LEDGER_SEND_STALL_S": "3",
        }
    )
    assert (
        settings.http_header_timeout_s,
        settings.http_keep_alive_s,
        settings.http_max_head_bytes,
        settings.http_max_connections,
        settings.http_implementation,
        settings.send_buffer_bytes,
        settings.send_stall_s,
    ) == (2.5, 7.0, 1024, 99, "h11", 4096, 3.0)
