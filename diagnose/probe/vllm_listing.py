"""`python -m diagnose.probe.vllm_listing`, in a venv with vLLM and the repo on
PYTHONPATH: the vLLM plugin's hooks (vllm.py's table) that this release has,
one per line as status, module and name, without starting vLLM
(benchmarks/vllm_matrix.py reads it)."""
from __future__ import annotations

from diagnose.probe.vllm import HOOKS
from diagnose.probe.vllm_hooks import listing, release


def main() -> None:
    print(f"vllm {release()}")
    for hook, status in listing(HOOKS):
        print(f"{status}\t{hook.module}\t{hook.name}")


if __name__ == "__main__":
    main()
