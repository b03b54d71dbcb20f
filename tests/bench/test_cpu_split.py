"""``python -m bench run --profile DIR`` and ``bench.cpu_split``: where a server's CPU goes."""

from __future__ import annotations

import cProfile
import json
import pstats

import pytest

from bench.cpu_split import component, load_dir, render, split
from tests.bench.commands import UNPINNED, python_m


@pytest.mark.parametrize(
    ("filename", "expected"),
    [
        ("~", "C functions"),
        ("/work/main/domain/decoder.py", "domain"),
        ("/work/main/app/live.py", "app/live.py"),
        ("/work/main/app/engines/echo.py", "app/engines"),
        ("/work/main/app/prompting.py", "app (other)"),
        ("/work/main/persistence/sql.py", "persistence"),
        ("/work/main/bench/naive.py", "bench"),
        ("/x/.venv/lib/python3.11/site-packages/asyncpg/connection.py", "asyncpg"),
        ("/x/.venv/lib/python3.11/site-packages/sniffio/_impl.py", "anyio"),
        ("/x/.venv/lib/python3.11/site-packages/sse_starlette/sse.py", "sse_starlette"),
        ("/x/.venv/lib/python3.11/site-packages/pydantic/main.py", "other packages"),
        ("/root/.pyenv/versions/3.11.7/lib/python3.11/asyncio/tasks.py", "asyncio"),
        ("/root/.pyenv/versions/3.11.7/lib/python3.11/json/encoder.py", "json"),
        ("/root/.pyenv/versions/3.11.7/lib/python3.11/weakref.py", "stdlib (other)"),
        ("<frozen importlib._bootstrap>", "stdlib (other)"),
    ],
)
def test_a_function_belongs_to_the_component_of_its_file(filename, expected):
    assert component(filename) == expected


def _each_token() -> int:
    n = 0
    for i in range(2_000):  # its own time: no call inside
        n += i
    return n


def _once() -> int:
    n = 0
    for i in range(100_000):
        n += i
    return n


def test_a_function_called_every_token_is_on_the_per_token_path_and_one_called_once_is_not():
    profile = cProfile.Profile()
    profile.enable()
    _once()
    for _ in range(40):
        _each_token()
    profile.disable()
    stats = pstats.Stats(profile)
    result = split(stats, tokens=40, responses=1)
    rows = {name: row for (_, _, name), row in stats.stats.items()}  # type: ignore[attr-defined]
    here = component(__file__)
    assert result.calls[True] == 40  # _each_token
    assert result.us_per_token(here, True) == pytest.approx(rows["_each_token"][2] * 1e6 / 40)
    assert result.us_per_token(here, False) == pytest.approx(rows["_once"][2] * 1e6 / 40)
    # the parts add up to the whole
    whole = result.us_per_token()
    assert whole == pytest.approx(
        result.us_per_token(None, True) + result.us_per_token(None, False)
    )
    assert whole == pytest.approx(result.total_s * 1e6 / 40)


def test_a_split_needs_tokens():
    profile = cProfile.Profile()
    profile.enable()
    profile.disable()
    with pytest.raises(ValueError, match="tokens"):
        split(pstats.Stats(profile), tokens=0, responses=0)


@pytest.mark.slow
def test_a_profiled_run_keeps_each_servers_profile_and_prints_the_split(tmp_path):
    """The naive peer (``-m``) and the ledger (``-c``) each under ``bench.profiled``, through
    the harness, as a developer runs it; their token times (the scripted engine's side file, the
    peer's) reach the load generator, whose mid-stream p99 the harness reports."""
    profiles = tmp_path / "profiles"
    report = tmp_path / "bench.json"
    proc = python_m(
        "bench", "run",
        "--profile", str(profiles),
        "--target", "naive", "--target", "ledger-sqlite",
        "--concurrency", "2", "--reps", "1", "--tokens", "30", "--total-tokens", "300",
        *UNPINNED, "--json", str(report),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    for target in ("naive", "ledger-sqlite"):
        meta = json.loads((profiles / f"{target}-c2-round0-rep0.json").read_text())
        assert meta["tokens"] == 300 and meta["streams"] == 10
        assert (profiles / f"{target}-c2-round0-rep0.prof").stat().st_size > 0
    found = {p.target: p for p in load_dir(profiles)}
    assert set(found) == {"naive", "ledger-sqlite"}
    # each profile holds its own server's code, measured: the peer's module, the ledger's pipeline
    assert found["naive"].split.us_per_token("bench") > 0
    assert found["naive"].split.us_per_token("domain") == 0
    assert found["ledger-sqlite"].split.us_per_token("domain", True) > 0
    assert found["ledger-sqlite"].split.us_per_token("app/live.py") > 0
    # (bench.profiled's signal handler is the ledger's only bench code)
    assert (
        found["ledger-sqlite"].split.us_per_token("bench")
        < 0.01 * found["ledger-sqlite"].split.us_per_token()
    )
    # printed after the usual table, as render makes it
    assert "C=2: profiled µs a token" in proc.stdout
    assert render(list(found.values())).splitlines()[0] in proc.stdout
    assert "| domain |" in proc.stdout and "| **all** |" in proc.stdout
    # 30 deltas a stream: ten in the middle of each, every stream's token times found
    assert "mid p99 ms" in proc.stdout
    summaries = {s["target"]: s for s in json.loads(report.read_text())["summaries"]}
    for summary in summaries.values():
        assert summary["latency_p99_ms"] is not None and summary["latency_mid_p99_ms"] is not None
    # the ledger's commits during the run, from its /metrics; the peer has none
    assert summaries["ledger-sqlite"]["commits"] > 0
    assert 0 <= summaries["ledger-sqlite"]["slow_commits"] <= summaries["ledger-sqlite"]["commits"]
    assert summaries["naive"]["commits"] is None and "slow commits" in proc.stdout
