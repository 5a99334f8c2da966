"""Writes engine/entrypoints/vllm_serve_flags.txt: every option string of real vLLM's `vllm serve`,
read from vLLM's own argument parser, so that `python -m engine serve` can name the vLLM
flags it does not have. Run it with vLLM's Python after an upgrade of vLLM:

    .venv-vllm/bin/python tests/vllm_env/list_serve_flags.py
"""
from __future__ import annotations

import os

import vllm
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "engine", "entrypoints", "vllm_serve_flags.txt")


def main() -> None:
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    flags = sorted({flag for action in parser._actions for flag in action.option_strings})
    with open(OUT, "w") as out:
        out.write(f"# The option strings of vLLM {vllm.__version__}'s `vllm serve`, one a line, read\n"
                  "# from its own argument parser by tests/vllm_env/list_serve_flags.py.\n")
        out.writelines(f"{flag}\n" for flag in flags)
    print(f"wrote {len(flags)} flags of vLLM {vllm.__version__} to {os.path.normpath(OUT)}")


if __name__ == "__main__":
    main()
