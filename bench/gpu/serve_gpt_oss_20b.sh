#!/usr/bin/env bash
# gpt-oss-20b's architecture with random weights on an NVIDIA GPU: serve it with responses-ledger
# (--engine vllm) and measure, then measure vLLM's own OpenAI server and our engine in process on
# the same model for comparison. Nothing is downloaded: config.json is written from gpt-oss-20b's
# published hyperparameters (app/engines/tiny_model.py) and vLLM fills the weights with random
# values (--load-format dummy), so the text is noise; throughput counts the engine's output tokens.
#
# Usage (from anywhere; run on the GPU machine):
#   bench/gpu/serve_gpt_oss_20b.sh
# Environment (defaults in brackets):
#   INSTALL=1          pip install vllm (the CUDA build) and this project first [0]
#   KIND               20b (all bf16, ~42 GB), 20b-mxfp4 (experts in MXFP4, as released; the
#                      dummy loader leaves integer weights uninitialised), or tiny (CPU smoke test) [20b]
#   PORT [8000]  MAX_MODEL_LEN [8192; tiny: 4096]  GPU_MEMORY_UTILIZATION [0.90]
#   CONCURRENCY [1,16,64,256]  TOKENS: max output tokens per stream [512]
#   STARTUP_TIMEOUT seconds [900]   WORK: scratch directory [a new one under /tmp]
#   COMPARE=0          skip the vLLM-frontend / in-process comparison [1]
#   BENCH_RUN_ARGS     if set, also run `python -m bench run $BENCH_RUN_ARGS` at the end
#   SERVE_ARGS         extra arguments for `responses-ledger serve`
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
PYTHON="${PYTHON:-python}"
KIND="${KIND:-20b}"
PORT="${PORT:-8000}"
if [[ "$KIND" == tiny ]]; then DEFAULT_LEN=4096; else DEFAULT_LEN=8192; fi
MAX_MODEL_LEN="${MAX_MODEL_LEN:-$DEFAULT_LEN}"
GPU_MEMORY_UTILIZATION="${GPU_MEMORY_UTILIZATION:-0.90}"
CONCURRENCY="${CONCURRENCY:-1,16,64,256}"
TOKENS="${TOKENS:-512}"
STARTUP_TIMEOUT="${STARTUP_TIMEOUT:-900}"
COMPARE="${COMPARE:-1}"
WORK="${WORK:-$(mktemp -d /tmp/gpt-oss-bench.XXXXXX)}"
MODEL_DIR="$WORK/gpt-oss-$KIND"
NAME="gpt-oss-20b"

if [[ "${INSTALL:-0}" == 1 ]]; then
    "$PYTHON" -m pip install vllm
    "$PYTHON" -m pip install -e "$REPO"
fi

# vLLM's caches, temp files and IPC sockets stay in the scratch directory.
export VLLM_CACHE_ROOT="${VLLM_CACHE_ROOT:-$WORK/vllm-cache}"
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$WORK/inductor-cache}"
export RESPONSES_LEDGER_LOG_LEVEL="${RESPONSES_LEDGER_LOG_LEVEL:-warning}"

"$PYTHON" -m app.engines.tiny_model "$MODEL_DIR" "$KIND" >/dev/null
echo "model config: $MODEL_DIR/config.json ($KIND, random weights)"

if [[ "$KIND" == tiny ]]; then  # vLLM's CPU build: eager, explicit KV cache size
    ENGINE_ARGS=(--dtype bfloat16 --enforce-eager --kv-cache-memory-bytes 64M)
    COMPARE_ARGS=(--kind tiny --kv-cache-memory-bytes 64M)
else
    ENGINE_ARGS=(--dtype bfloat16 --gpu-memory-utilization "$GPU_MEMORY_UTILIZATION")
    COMPARE_ARGS=(--kind "$KIND" --no-enforce-eager --kv-cache-memory-bytes 0
                  --engine-args "{\"gpu_memory_utilization\": $GPU_MEMORY_UTILIZATION}")
fi

# -- 1. responses-ledger with the vLLM engine ----------------------------------------------------
SERVER_LOG="$WORK/server.log"
"$PYTHON" -c 'import sys; from app.cli import main; sys.exit(main())' serve \
    --engine vllm --model "$MODEL_DIR" --served-model-name "$NAME" \
    --load-format dummy --max-model-len "$MAX_MODEL_LEN" --seed 0 "${ENGINE_ARGS[@]}" \
    --database-url "sqlite+aiosqlite:///$WORK/responses.db" \
    --host 127.0.0.1 --port "$PORT" ${SERVE_ARGS:-} >"$SERVER_LOG" 2>&1 &
SERVER_PID=$!
stop_server() {
    if kill -0 "$SERVER_PID" 2>/dev/null; then
        kill "$SERVER_PID"
        wait "$SERVER_PID" 2>/dev/null || true
    fi
}
trap stop_server EXIT

echo "waiting for responses-ledger on :$PORT (log: $SERVER_LOG) ..."
started=$SECONDS
until curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null; do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
        echo "the server exited; last lines of its log:" >&2
        tail -n 40 "$SERVER_LOG" >&2
        exit 1
    fi
    if (( SECONDS - started > STARTUP_TIMEOUT )); then
        echo "the server did not start within ${STARTUP_TIMEOUT}s" >&2
        tail -n 40 "$SERVER_LOG" >&2
        exit 1
    fi
    sleep 2
done
echo "ready after $(( SECONDS - started ))s"

echo "== responses-ledger --engine vllm: POST /v1/responses, streamed =="
"$PYTHON" bench/gpu/drive_responses.py --url "http://127.0.0.1:$PORT" --model "$NAME" \
    --concurrency "$CONCURRENCY" --tokens "$TOKENS" | tee "$WORK/ledger.txt"
stop_server
trap - EXIT

# -- 2. vLLM's own OpenAI server, and our engine without the server ------------------------------
if [[ "$COMPARE" == 1 ]]; then
    echo "== vLLM's OpenAI server (/v1/completions) and VllmEngine in process =="
    "$PYTHON" -m bench.vllm_frontend --side both --model-dir "$MODEL_DIR" "${COMPARE_ARGS[@]}" \
        --max-model-len "$MAX_MODEL_LEN" --concurrency "$CONCURRENCY" --tokens "$TOKENS" \
        --startup-timeout "$STARTUP_TIMEOUT" | tee "$WORK/vllm.txt"
fi

# -- 3. the project's benchmark matrix, if asked for -----------------------------------------------
if [[ -n "${BENCH_RUN_ARGS:-}" ]]; then
    # shellcheck disable=SC2086
    "$PYTHON" -m bench run $BENCH_RUN_ARGS
fi
echo "results in $WORK"
