#!/usr/bin/env bash
# Issue 20's many-core measurements on a lent machine that reaches no network (the workplace's
# GPU machine: 16 cores, its own Python 3.12, no PostgreSQL, no vLLM): what `bench.frontends` and
# `bench run` need, brought along and started here, then the benchmarks in order of what a run
# there is for, each only while the time budget allows it.
#
# Prepared on the developer machine (both folders are ignored by git and carried to the machine):
#   .whl/        the runtime's wheels for the machine's Python (cp312, manylinux), and
#                pgserver's wheel, whose PostgreSQL 16 binaries (pgserver/pginstall) serve the
#                benchmarks' database; pgserver's Python code is not used
#   .cache/tiktoken/o200k_base.tiktoken   the Harmony vocabulary (built by `make setup`)
# made with (and `/.whl/` added to .git/info/exclude):
#   python3 -m pip download --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
#     <pyproject.toml's [project] dependencies, pinned as there> httpx==0.28.1 psutil
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux2014_x86_64 -d .whl pgserver==0.1.4
# (about 32 MB; the device tool's call names `.whl` and `.cache` in `carry`).
# bench/RESULTS.md ("Issue 20 on a 16-core machine") says how they were made and what came out.
#
# Usage on that machine, from the repository root:
#   OUT=/some/dir BUDGET_S=540 bash bench/gpu/lent_machine.sh
# Environment: OUT [/tmp/lent-out], BUDGET_S: seconds this script may take in all [540],
#   FRONTENDS [1,2,4,8], LOADGENS [6], STREAMS_PER_FRONTEND [512], FRONTEND_REPS [2],
#   STAGES: which of frontends,paced,unpaced to run [all three, in that order],
#   WHEELS [.whl]: the wheels to install; without the folder, the caller's packages are used,
#   PGDATA_PARENT: where PostgreSQL's cluster goes [/tmp]; /dev/shm puts it in memory, where a
#     commit waits for no disk (not durable: for telling the disk's share from the frontends').
#   PGPORT [5432]: PostgreSQL is started on 127.0.0.1:PGPORT unless something listens there
#   already; the benchmarks use 5432 (bench/targets.py). The cluster is removed at the end.
# machine.txt records the cores, their topology, the GPU, whether vLLM is there, and the disk's
# fdatasync latency (5 s of 20 KB appends), which every durable commit waits for.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
OUT="${OUT:-/tmp/lent-out}"
BUDGET_S="${BUDGET_S:-540}"
FRONTENDS="${FRONTENDS:-1,2,4,8}"
LOADGENS="${LOADGENS:-6}"
STREAMS_PER_FRONTEND="${STREAMS_PER_FRONTEND:-512}"
FRONTEND_REPS="${FRONTEND_REPS:-2}"
STAGES="${STAGES:-frontends,paced,unpaced}"
PGPORT="${PGPORT:-5432}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
start=$SECONDS
say() { echo "[$((SECONDS - start))s] $*"; }
left() { echo $((BUDGET_S - (SECONDS - start))); }

# -- the machine -------------------------------------------------------------------------------
{
    echo "cores: $(nproc); $(grep -m1 'model name' /proc/cpuinfo)"
    # are the cores hyperthreads of fewer physical ones (then N frontends share them)?
    command -v lscpu >/dev/null && lscpu | grep -E '^(Thread|Core|Socket|NUMA node)\(s\)|^NUMA node[0-9]'
    echo "memory: $(grep MemTotal /proc/meminfo)"
    command -v nvidia-smi >/dev/null && nvidia-smi -L
    "$PY" -c 'import sys; print("python", sys.version.split()[0])'
    "$PY" -c 'import vllm; print("vllm", vllm.__version__)' 2>&1 | tail -n 1
    df -hT /tmp "$REPO" | tail -n 2
    # the disk every durable commit waits for: 5 s of 20 KB appends, each followed by fdatasync
    "$PY" - <<'EOF'
import os, tempfile, time
fd, path = tempfile.mkstemp(dir="/tmp")
times, block, end = [], b"x" * 20480, time.monotonic() + 5
while time.monotonic() < end:
    t = time.perf_counter(); os.write(fd, block); os.fdatasync(fd); times.append(time.perf_counter() - t)
os.close(fd); os.unlink(path); times.sort()
print(f"fdatasync of 20 KB appends on /tmp: {len(times)} in 5 s, p50 {times[len(times) // 2] * 1e3:.2f} ms,"
      f" p99 {times[int(len(times) * 0.99)] * 1e3:.2f} ms, max {times[-1] * 1e3:.1f} ms,"
      f" over 100 ms: {sum(t > 0.1 for t in times)}")
EOF
} | tee "$OUT/machine.txt"

# -- Python packages ---------------------------------------------------------------------------
WHEELS="${WHEELS:-.whl}"
if [[ -d "$WHEELS" ]]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$WHEELS"/*.whl || { echo "wheel install failed" >&2; exit 1; }
    export PYTHONPATH="/tmp/site:$REPO"
else
    export PYTHONPATH="$REPO"
fi
"$PY" -c 'import app.main, bench.harness, uvicorn, asyncpg, openai_harmony' || exit 1
"$PY" -c 'import importlib.util as u; print("uvloop:", bool(u.find_spec("uvloop")),
    "httptools:", bool(u.find_spec("httptools")))' | tee -a "$OUT/machine.txt"
say "packages ready"

# -- PostgreSQL on 127.0.0.1:$PGPORT ------------------------------------------------------------
pg_up() { "$PY" -c "import socket,sys; socket.create_connection(('127.0.0.1', $PGPORT), 1)" 2>/dev/null; }
if ! pg_up; then
    PGBIN="${PGBIN:-/tmp/site/pgserver/pginstall/bin}"
    DROP_PGDATA=0
    if [[ -z "${PGDATA:-}" ]]; then  # a cluster of this run's own, removed at the end
        PGDATA="$(mktemp -d "${PGDATA_PARENT:-/tmp}/pgdata.XXXXXX")" && DROP_PGDATA=1
    fi
    # PostgreSQL refuses to run as root: the cluster belongs to `nobody`
    as_pg() {
        if [[ $(id -u) != 0 ]]; then sh -c "$*"
        elif command -v setpriv >/dev/null; then
            setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups sh -c "$*"
        else su -s /bin/sh nobody -c "$*"; fi
    }
    mkdir -p "$PGDATA" && { [[ $(id -u) != 0 ]] || chown nobody "$PGDATA"; }
    as_pg "$PGBIN/initdb -D $PGDATA -U postgres -A trust -E UTF8 --locale=C" >"$OUT/initdb.log" 2>&1 \
        || { tail -n 20 "$OUT/initdb.log"; exit 1; }
    as_pg "$PGBIN/pg_ctl -D $PGDATA -l $PGDATA/log -w start -o '-p $PGPORT -k /tmp \
        -c listen_addresses=127.0.0.1 -c max_connections=400'" >/dev/null \
        || { cat "$PGDATA/log" >&2; exit 1; }
    trap 'as_pg "$PGBIN/pg_ctl -D $PGDATA -m fast stop" >/dev/null 2>&1; ((DROP_PGDATA)) && rm -rf "$PGDATA"' EXIT
fi
"$PY" - <<EOF || exit 1
import asyncio, asyncpg
async def main():
    conn = await asyncpg.connect("postgresql://postgres@127.0.0.1:$PGPORT/postgres")
    print("postgres", await conn.fetchval("show server_version"),
          "fsync", await conn.fetchval("show fsync"),
          "synchronous_commit", await conn.fetchval("show synchronous_commit"))
    await conn.close()
asyncio.run(main())
EOF
say "postgres ready"

# -- the benchmarks, in order, each only while the budget allows it ----------------------------
stage() { [[ ",$STAGES," == *",$1,"* ]]; }
if stage frontends && (($(left) > 150)); then
    say "bench.frontends --frontends $FRONTENDS"
    "$PY" -m bench.frontends --frontends "$FRONTENDS" --loadgens "$LOADGENS" \
        --streams-per-frontend "$STREAMS_PER_FRONTEND" --reps "$FRONTEND_REPS" \
        --json "$OUT/frontends.json" 2>&1 | tee "$OUT/frontends.txt"
fi
if stage paced && (($(left) > 210)); then
    say "bench run, paced"
    "$PY" -m bench run --rounds 1 --reps 1 --concurrency 64,256 --token-delay-ms 10 --tokens 200 \
        --target naive --target ledger-sqlite --target ledger-postgres \
        --json "$OUT/paced.json" 2>&1 | tee "$OUT/paced.txt"
fi
if stage unpaced && (($(left) > 170)); then
    say "bench run, unpaced"
    "$PY" -m bench run --rounds 1 --reps 1 --concurrency 16,64,256 --tokens 1000 \
        --target naive --target ledger-sqlite --target ledger-postgres \
        --json "$OUT/unpaced.json" 2>&1 | tee "$OUT/unpaced.txt"
fi
say "done"
