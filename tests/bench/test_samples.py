"""``python -m bench run --sample DIR`` and ``bench.samples``: a server's CPU, sampled by py-spy."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from bench import harness
from bench.samples import GENERATED, NO_FRAME, Sampled, count, load_dir, py_spy, render
from tests.bench.commands import UNPINNED, python_m

_VENV = "/x/.venv/lib/python3.11/site-packages"


def test_a_sample_counts_for_the_component_of_its_innermost_frame():
    lines = [
        # the event loop in the ledger's decoder: domain, whatever called it
        "run (/x/app/transport.py:766);feed (/x/domain/decoder.py:269) 7\n",
        # a write from the live path, inside uvicorn's transport: uvicorn
        f"_flush (/x/app/live.py:408);send ({_VENV}/uvicorn/protocols/http/h.py:463) 3\n",
        "encode (/root/.pyenv/versions/3.11.7/lib/python3.11/json/encoder.py:205) 2\n",
        "_run (/x/persistence/sqlite_writer.py:90) 5\n",
        "apply (/x/domain/machine.py:205);__init__ (<string>:6) 4\n",
        " 1\n",  # a thread with no Python frame
        "\n",
    ]
    assert count(lines) == {
        "domain": 7,
        "uvicorn": 3,
        "json": 2,
        "persistence": 5,
        GENERATED: 4,
        NO_FRAME: 1,
    }


def test_shares_of_the_samples_are_shares_of_the_measured_cpu_a_token():
    sampled = Sampled("t", 4, {"domain": 30, "uvicorn": 10}, tokens=1_000, server_cpu_s=0.04)
    assert sampled.us_per_token() == pytest.approx(40.0)  # 0.04 s over 1,000 tokens
    assert sampled.us_per_token("domain") == pytest.approx(30.0)
    assert sampled.us_per_token("uvicorn") == pytest.approx(10.0)
    assert sampled.us_per_token("asyncpg") == 0.0
    table = render([sampled])
    assert "| domain | 30.00 | 75.0% |" in table
    assert "| **all** | **40.00** | 40 samples |" in table
    assert sampled.coverage == pytest.approx(40 / (0.04 * 200))  # 5.0: more samples than CPU
    assert "| samples per CPU-second at the rate | 5.00 | |" in table


@pytest.mark.slow
def test_a_sampled_run_keeps_each_servers_stacks_and_prints_the_split(tmp_path):
    """The naive peer and the ledger, each sampled by py-spy through the harness, as a developer
    runs it: each run's stacks are its own server's code, and the split adds up to the server CPU
    a token the harness measured."""
    assert py_spy() is not None, "py-spy is a test dependency (pyproject.toml)"
    out = tmp_path / "samples"
    report = tmp_path / "bench.json"
    proc = python_m(
        "bench", "run",
        "--sample", str(out),
        "--target", "naive", "--target", "ledger-sqlite",
        "--concurrency", "4", "--reps", "1", "--tokens", "200", "--total-tokens", "60000",
        *UNPINNED, "--json", str(report),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    summaries = {s["target"]: s for s in json.loads(report.read_text())["summaries"]}
    for target in ("naive", "ledger-sqlite"):
        meta = json.loads((out / f"{target}-c4-round0-rep0.json").read_text())
        assert meta["tokens"] == 60000 and meta["server_cpu_s"] > 0
        assert (out / f"{target}-c4-round0-rep0.txt").stat().st_size > 0
    found = {s.target: s for s in load_dir(out)}
    assert set(found) == {"naive", "ledger-sqlite"}
    # a second or more of a busy server at 200 samples a second
    assert found["naive"].total > 50 and found["ledger-sqlite"].total > 50, found
    # each server's own code: the peer's framework and no ledger, the ledger's pipeline
    frameworks = ("uvicorn", "starlette", "sse_starlette", "anyio")
    assert sum(found["naive"].samples.get(name, 0) for name in frameworks) > 0, found["naive"]
    ledgers = ("domain", "persistence", "app/live.py", "app/transport.py", "app (other)")
    assert sum(found["ledger-sqlite"].samples.get(name, 0) for name in ledgers) > 0, found
    assert not any(name in found["naive"].samples for name in ledgers), found["naive"]
    assert "bench" not in found["ledger-sqlite"].samples
    for target, sampled in found.items():
        assert sampled.us_per_token() == pytest.approx(
            summaries[target]["server_cpu_us_per_token"], rel=1e-6
        )
    # printed after the usual table, as render makes it
    assert render(list(found.values())).splitlines()[0] in proc.stdout
    assert "| **all** |" in proc.stdout


@pytest.mark.parametrize(
    ("first", "second", "refusal"),
    [
        ("--profile", "--sample", "--profile and --sample"),
        ("--profile", "--turns", "--profile and --turns"),
        ("--sample", "--turns", "--sample and --turns"),
    ],
)
def test_profile_sample_and_turns_are_one_at_a_time(tmp_path, first, second, refusal):
    proc = python_m(
        "bench", "run", first, str(tmp_path / "a"), second, str(tmp_path / "b"),
        "--target", "naive", timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert refusal in proc.stderr


def test_a_run_that_fails_leaves_no_sampler_behind(tmp_path):
    """The sampler the harness starts for a measured run is killed when the run fails (the load
    generator, say), not left sampling a server the run gives up on; one whose run ends writes
    its stacks."""
    assert py_spy() is not None, "py-spy is a test dependency (pyproject.toml)"
    busy = "while True: sum(range(1000))"  # (py-spy leaves out an idle one's stacks)
    server = subprocess.Popen([sys.executable, "-c", busy])
    try:
        with (
            pytest.raises(RuntimeError, match="the load generator failed"),
            harness._sampling(server.pid, tmp_path / "failed.txt") as sampler,
        ):
            raise RuntimeError("the load generator failed")
        assert sampler.poll() is not None  # gone, not sampling
        assert not (tmp_path / "failed.txt").exists()
        with harness._sampling(server.pid, tmp_path / "kept.txt") as sampler:
            time.sleep(0.5)
        assert sampler.returncode == 0 and (tmp_path / "kept.txt").stat().st_size > 0
    finally:
        server.kill()
        server.wait()
