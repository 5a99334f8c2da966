"""vLLM's spellings on `python -m engine`'s command line.

Flags may be written with underscores, as vLLM's FlexibleArgumentParser allows;
and a vLLM serve flag this engine does not have is named as such, not reported
as a typo. The list of vLLM's flags is data (vllm_serve_flags.txt), read from
vLLM's own parser by tests/vllm_env/list_serve_flags.py.
"""
from __future__ import annotations

import functools
from importlib import resources


@functools.cache
def vllm_serve_flags() -> frozenset[str]:
    text = resources.files("engine.entrypoints").joinpath("vllm_serve_flags.txt").read_text()
    return frozenset(line for line in text.splitlines() if line and not line.startswith("#"))


def dashed(argv: list[str], known: set[str]) -> list[str]:
    """`--tensor_parallel_size 2` -> `--tensor-parallel-size 2`, `--max_model_len=4k` too;
    only for names that are flags once dashed, so values and typos stay as given."""
    out = []
    for arg in argv:
        name, eq, value = arg.partition("=")
        if arg.startswith("--") and "_" in name:
            candidate = "--" + name[2:].replace("_", "-")
            if candidate in known or candidate in vllm_serve_flags():
                arg = candidate + eq + value
        out.append(arg)
    return out


def leftover_flags(extras: list[str]) -> tuple[list[str], list[str]]:
    """The flags among argparse's leftovers, each named once: (vLLM's, the others)."""
    flags = dict.fromkeys(arg.partition("=")[0] for arg in extras if arg.startswith("-"))
    return ([flag for flag in flags if flag in vllm_serve_flags()],
            [flag for flag in flags if flag not in vllm_serve_flags()])
