"""The load generator's stream reader, fed recorded responses split at every offset."""

from __future__ import annotations

import asyncio
import itertools
import json
from array import array
from typing import Any

import pytest

from bench import token_times
from bench.loadgen import MID_EDGE, LoadConfig, StreamReader, _latency
from bench.naive import _events
from bench.targets import LEDGER_WORD
from domain.builder import ResponseBuilder, Usage
from domain.projections import to_sse
from tests.domain.factories import counter_ids, response_skeleton

HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)


def naive_frames(n: int, coalesce: int = 1) -> list[bytes]:
    async def collect() -> list[bytes]:
        return [frame async for frame in _events(n, "m", coalesce, None)]

    return asyncio.run(collect())


def chunked(writes: list[bytes]) -> bytes:
    return HEAD + b"".join(b"%x\r\n%b\r\n" % (len(w), w) for w in writes) + b"0\r\n\r\n"


def feed_in_pieces(raw: bytes, cuts: list[int], expected: int | None) -> StreamReader:
    reader = StreamReader(expected)
    start = 0
    for i, cut in enumerate([*cuts, len(raw)]):
        reader.feed(raw[start:cut], now=1000 + i)
        start = cut
    return reader


def test_reads_a_naive_stream_whole():
    raw = chunked(naive_frames(5))
    reader = feed_in_pieces(raw, [], expected=13)
    assert reader.done and reader.error is None
    assert (reader.events, reader.deltas) == (13, 5)
    assert reader.response_id is not None and reader.response_id.startswith("resp_")
    assert reader.last_type == "response.completed"


@pytest.mark.parametrize("coalesce", [1, 3])
def test_every_split_point_gives_the_same_counts(coalesce):
    raw = chunked(naive_frames(3, coalesce))
    for cut in range(1, len(raw)):
        reader = feed_in_pieces(raw, [cut], expected=11)
        assert reader.done, cut
        assert reader.error is None, (cut, reader.error)
        assert (reader.events, reader.deltas) == (11, 3), cut


def test_read_times_are_per_read_with_running_delta_counts():
    frames = naive_frames(4)
    raw = chunked(frames)
    # Split right after the 2nd delta's chunk, and again after the 4th.
    cut1 = raw.index(b"%x\r\n%b\r\n" % (len(frames[5]), frames[5])) + len(frames[5]) + 6
    cut2 = raw.index(frames[8])
    reader = feed_in_pieces(raw, [cut1, cut2], expected=12)
    assert reader.error is None
    assert list(reader.batch_deltas) == [2, 4]
    assert list(reader.batch_ns) == [1000, 1001]


def test_crlf_separators_and_ping_comments():
    frames = [f.replace(b"\n", b"\r\n") for f in naive_frames(2)]
    frames.insert(3, b": ping - 2026-01-01\r\n\r\n")
    reader = feed_in_pieces(chunked(frames), [], expected=10)
    assert reader.error is None
    assert reader.sep == b"\r\n\r\n"
    assert (reader.events, reader.deltas) == (10, 2)


def test_wrong_event_count_is_an_error():
    reader = feed_in_pieces(chunked(naive_frames(2)), [], expected=99)
    assert reader.error == "10 events, expected 99"


def test_sequence_gap_is_an_error():
    frames = naive_frames(3)
    del frames[5]
    reader = feed_in_pieces(chunked(frames), [], expected=None)
    assert reader.error is not None and "sequence_number" in reader.error


def test_stream_that_does_not_complete_is_an_error():
    frames = naive_frames(2)[:-1]
    reader = feed_in_pieces(chunked(frames), [], expected=None)
    assert reader.error is not None and "response.completed" in reader.error


def test_connection_lost_mid_stream_is_an_error():
    raw = chunked(naive_frames(2))
    reader = StreamReader(10)
    reader.feed(raw[: len(raw) // 2], now=1)
    reader.connection_closed(now=2)
    assert reader.done and reader.error is not None


def test_http_error_is_reported_with_its_body():
    body = json.dumps({"error": {"message": "no such model"}}).encode()
    raw = b"HTTP/1.1 404 Not Found\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body)
    reader = feed_in_pieces(raw, [20], expected=10)
    assert reader.done
    assert (
        reader.error is not None and "HTTP 404" in reader.error and "no such model" in reader.error
    )


class _Served:
    """A keep-alive HTTP/1.1 server for the load generator's runs: it answers each request on a
    connection with ``response``, ``hold_s`` after reading it, and records when each request
    arrived (seconds after the run's start, sorted) and how many connections it accepted."""

    def __init__(self, response: bytes, hold_s: float = 0.0) -> None:
        self.response = response
        self.hold_s = hold_s
        self.arrivals: list[float] = []
        self.connections = 0
        self._times: list[float] = []

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break  # the client closed the connection
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            self._times.append(asyncio.get_running_loop().time())
            if self.hold_s:
                await asyncio.sleep(self.hold_s)
            writer.write(self.response)
            await writer.drain()
        writer.close()

    def run(self, **fields: Any) -> dict:
        """``run_load`` against this server, a streaming request each time: ``fields`` are the
        rest of its ``LoadConfig``."""
        from bench.loadgen import run_load

        async def main() -> dict:
            server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            start = asyncio.get_running_loop().time()
            url = f"http://127.0.0.1:{port}/v1/responses"
            report = await run_load(LoadConfig(url=url, body=b'{"stream":true}', **fields))
            await asyncio.sleep(0.1)  # the handlers see the client close its connections
            server.close()
            self.arrivals = sorted(t - start for t in self._times)
            return report

        return asyncio.run(main())


def test_stagger_spreads_the_workers_first_requests():
    """``stagger_s``: worker i sends its first request i * stagger_s / concurrency seconds in,
    and every stream is still read whole."""
    served = _Served(chunked(naive_frames(3)))
    report = served.run(concurrency=4, expected_events=3 + 8, stagger_s=0.8)
    assert report["errors"] == [] and report["streams"] == 4
    arrivals = served.arrivals
    for i, at in enumerate(arrivals):
        assert i * 0.2 <= at < i * 0.2 + 0.15, arrivals


def test_stagger_without_a_paced_engine_is_refused(capsys):
    """``bench run --stagger`` spreads the starts over a paced stream's duration: without
    ``--token-delay-ms`` there is none, and the flag is refused rather than ignored."""
    from bench.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--stagger", "--target", "naive"])
    assert exit_info.value.code == 2
    assert "--stagger needs --token-delay-ms" in capsys.readouterr().err


def test_open_loop_arrivals_are_a_seeded_poisson_process():
    """``arrival_offsets_ns``: the first stream at 0, then independent exponential gaps of mean
    1 / rate (a Poisson process: the gaps' spread as large as their mean), the same schedule for
    the same seed and another for another seed; a rate that is not positive is refused."""
    from bench.loadgen import arrival_offsets_ns

    offsets = arrival_offsets_ns(100.0, 20_000, seed=7)
    assert offsets[0] == 0 and offsets == sorted(offsets)
    gaps = [(b - a) / 1e9 for a, b in itertools.pairwise(offsets)]
    mean = sum(gaps) / len(gaps)
    spread = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5
    assert 0.0097 < mean < 0.0103
    assert 0.9 < spread / mean < 1.1  # (evenly spaced starts would give 0)
    assert arrival_offsets_ns(100.0, 50, seed=7) == offsets[:50]
    assert arrival_offsets_ns(100.0, 50, seed=8) != offsets[:50]
    for rate in (0.0, -1.0):
        with pytest.raises(ValueError, match="positive"):
            arrival_offsets_ns(rate, 5, seed=0)


def test_an_open_loop_starts_each_stream_on_schedule_whatever_the_servers_pace():
    """With ``arrival_rate``, streams start at their arrival times even while every connection
    is busy (a server that holds each response 0.4 s gets 8 streams within ~0.4 s from a
    2-connection pool, which then grows), every stream is still read whole, and the latency
    figures count only the streams that start after ``measure_from_s``."""
    from bench.loadgen import arrival_offsets_ns

    rate, seed = 20.0, 3
    served = _Served(chunked(naive_frames(3)), hold_s=0.4)
    report = served.run(
        concurrency=2,
        streams_per_worker=4,
        expected_events=3 + 8,
        arrival_rate=rate,
        arrival_seed=seed,
        measure_from_s=0.1,
    )
    assert report["errors"] == [] and report["streams"] == 8
    assert report["per_stream_events"] == [11] * 8
    offsets = [o / 1e9 for o in arrival_offsets_ns(rate, 8, seed)]
    seen = served.arrivals
    for planned, at in zip(offsets, seen, strict=True):
        assert planned <= at < planned + 0.15, (offsets, seen)
    # a closed loop of two connections would have taken four rounds of 0.4 s
    assert report["wall_s"] < offsets[-1] + 0.4 + 0.5
    assert report["connections_opened"] > 2 and report["late_arrivals"] == 0
    assert report["arrival_rate"] == rate
    assert report["measured_streams"] == sum(1 for o in offsets if o >= 0.1)
    assert report["ttft_ms"]["n"] == report["measured_streams"]


def test_an_open_loop_does_not_reuse_a_connection_idle_past_its_limit(monkeypatch):
    """A free connection idle longer than ``_IDLE_LIMIT_NS`` is closed rather than used (the
    server may be closing it: uvicorn's keep-alive timeout), so streams half a second apart with
    a limit of 0.1 s each get a new connection, and with the limit at 10 s all share one."""
    from bench import loadgen

    def run(limit_ns: int) -> tuple[dict, int]:
        monkeypatch.setattr(loadgen, "_IDLE_LIMIT_NS", limit_ns)
        served = _Served(chunked(naive_frames(2)))
        report = served.run(
            concurrency=1,
            streams_per_worker=4,
            expected_events=2 + 8,
            arrival_rate=2.0,
            arrival_seed=0,
        )
        return report, served.connections

    gaps = loadgen.arrival_offsets_ns(2.0, 4, 0)
    assert min(b - a for a, b in itertools.pairwise(gaps)) > 250_000_000  # (the seed's gaps)
    report, accepted = run(100_000_000)
    assert report["errors"] == [] and accepted == 4 and report["connections_opened"] == 4
    report, accepted = run(10_000_000_000)
    assert report["errors"] == [] and accepted == 1 and report["connections_opened"] == 1


def test_open_loop_flags_that_cannot_apply_are_refused(capsys):
    """``bench run --open-loop`` needs a paced stream's duration for its rate and excludes
    ``--stagger``; ``bench.loadgen`` refuses ``--arrival-rate`` with ``--stagger-seconds``, and a
    negative rate: each says why rather than running something else."""
    from bench.__main__ import main
    from bench.loadgen import main as loadgen_main

    for argv, message in (
        (["run", "--open-loop", "--target", "naive"], "--open-loop needs --token-delay-ms"),
        (
            ["run", "--open-loop", "--stagger", "--token-delay-ms", "10", "--target", "naive"],
            "--open-loop and --stagger",
        ),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err
    base = ["--url", "http://127.0.0.1:9/v1/responses", "--body", "{}"]
    for extra, message in (
        (["--arrival-rate", "5", "--stagger-seconds", "1"], "an open loop has none"),
        (["--arrival-rate", "-1"], "positive rate"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            loadgen_main(base + extra)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err


def test_latency_samples_come_from_all_of_the_streams_deltas(tmp_path):
    """Each of 10 streams reads its 30 deltas one per read, 1 ms after the token's (recorded)
    yield plus its ordinal in µs; the samples are drawn from every position, not only the
    streams' first deltas (a stride longer than a stream used to keep nothing else)."""
    readers = []
    for _ in range(10):
        reader = StreamReader(None)
        reader.feed(chunked(naive_frames(30)), now=0)  # one read: parsed, times set below
        assert reader.response_id and reader.deltas == 30
        reader.batch_ns = array(
            "q", [10_000_000 + i * 1_000_000 + 1_000_000 + i * 1_000 for i in range(30)]
        )
        reader.batch_deltas = array("q", range(1, 31))
        token_times.append(
            tmp_path, reader.response_id, [10_000_000 + i * 1_000_000 for i in range(30)]
        )
        readers.append(reader)
    config = LoadConfig(
        url="http://x/v1/responses", body=b"{}", token_times_dir=tmp_path, samples=6
    )

    report = asyncio.run(_latency(config, readers))

    assert report["latency_ms"]["n"] == 300
    samples = report["latency_samples"]
    assert len(samples) == 6
    assert len({s["delta"] for s in samples}) > 1
    for s in samples:
        assert s["ms"] == pytest.approx(1 + s["delta"] / 1000)


def test_the_mid_stream_latency_leaves_out_each_streams_first_and_last_ten_deltas(tmp_path):
    """Streams that start and end together hold up each other's first and last tokens: the
    steady state's latency is reported apart (``latency_mid_ms``), the whole one as before."""
    readers = []
    for _ in range(4):
        reader = StreamReader(None)
        reader.feed(chunked(naive_frames(30)), now=0)
        # the first and last ten deltas 100 ms after their yield, the middle ten 1 ms
        late = [100 if i < MID_EDGE or i >= 30 - MID_EDGE else 1 for i in range(30)]
        reader.batch_ns = array(
            "q", [10_000_000 + i * 1_000_000 + late[i] * 1_000_000 for i in range(30)]
        )
        reader.batch_deltas = array("q", range(1, 31))
        token_times.append(
            tmp_path, reader.response_id, [10_000_000 + i * 1_000_000 for i in range(30)]
        )
        readers.append(reader)
    config = LoadConfig(url="http://x/v1/responses", body=b"{}", token_times_dir=tmp_path)

    report = asyncio.run(_latency(config, readers))

    assert report["latency_ms"]["n"] == 120 and report["latency_ms"]["p99"] == pytest.approx(100)
    middle = report["latency_mid_ms"]
    assert middle["n"] == 4 * (30 - 2 * MID_EDGE)
    assert middle["p99"] == pytest.approx(1) and middle["max"] == pytest.approx(1)


def ledger_frames(words_per_delta: list[int]) -> list[bytes]:
    """A ledger's stream whose deltas carry several tokens (words) each, as its coalescing
    builder makes them (``domain.builder``), framed as the server frames them."""
    builder = ResponseBuilder(response_skeleton("resp_marker"), new_id=counter_ids(), coalesce=True)
    builder.created()
    builder.in_progress()
    builder.open_message()
    events = builder.take()
    for n in words_per_delta:
        for _ in range(n):
            builder.append(LEDGER_WORD)
        events += builder.take()
    builder.finish("completed", usage=Usage(), completed_at=1)
    events += builder.take()
    return [to_sse(e) for e in events]


@pytest.mark.parametrize("cut", [None, 7, 300, 333, 700])
def test_a_token_marker_counts_the_tokens_in_deltas_that_carry_several(cut):
    """Deltas of 1, 3 and 2 words: 6 tokens, 3 delta events; the done events, which repeat
    the whole text, count none; a stream whose words do not add up fails."""
    raw = chunked(ledger_frames([1, 3, 2]))
    reader = StreamReader(None, LEDGER_WORD.encode(), expected_tokens=6)
    start = 0
    for i, end in enumerate([cut, len(raw)] if cut else [len(raw)]):
        reader.feed(raw[start:end], now=1000 + i)
        start = end
    assert reader.done and reader.error is None, reader.error
    assert (reader.deltas, reader.delta_events) == (6, 3)
    assert reader.batch_deltas[-1] == 6
    short = StreamReader(None, LEDGER_WORD.encode(), expected_tokens=7)
    short.feed(raw, now=1)
    assert short.error == "6 tokens in the deltas, expected 7"
    plain = StreamReader(None)  # without the marker: a token a delta
    plain.feed(raw, now=1)
    assert plain.deltas == 3
