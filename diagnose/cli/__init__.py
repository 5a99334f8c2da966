"""The `diag` command: one subcommand per job, each in the module named for what
it looks at (analyze.py, attach.py, launch.py, runs.py: dump, tui, demo; offline.py: logs,
synth). A subcommand is a function that adds its parser to `commands` (with
common.add_command, so that its --help ends with its exit codes and examples)
and sets `run` to the function that carries it out; add it to SUBCOMMANDS.

`diag` alone prints its commands on stdout and exits 0, as cargo does (git
exits 1, which is diag's code for "verdicts found").
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import traceback

from diagnose.cli.analyze import add_analyze
from diagnose.cli.attach import add_attach
from diagnose.cli.common import (DEBUG_VAR, EXIT_ERROR, EXIT_HEALTHY, EXIT_INTERNAL,
                                 EXIT_INTERRUPTED, EXIT_VERDICTS, Parser, UsageError)
from diagnose.cli.launch import add_launch
from diagnose.cli.offline import add_logs, add_synth
from diagnose.cli.runs import add_demo, add_dump, add_tui
from diagnose.cli.version import package_version
from diagnose.core.heap import tune_for_large_heaps
from diagnose.core.shown import shown

__all__ = ["EXIT_ERROR", "EXIT_HEALTHY", "EXIT_INTERNAL", "EXIT_INTERRUPTED", "EXIT_VERDICTS",
           "DEBUG_VAR", "SUBCOMMANDS", "build_parser", "main"]

SUBCOMMANDS = (add_launch, add_attach, add_analyze, add_dump, add_tui, add_logs, add_synth,
               add_demo)
EPILOG = """Each command's --help lists its options, exit codes and examples.
exit codes: 0 healthy, 1 verdicts found, 2 bad input, 3 a bug in diag, 4 (diag launch)
the job crashed, 128+N diag was ended by signal N; never the command's own code."""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="diag", description="Find the rank at the root of a hang in "
                                             "tensor- and pipeline-parallel LLM serving.",
                    epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-V", "--version", action="version",
                        version=f"diag (hangscope) {package_version()}",
                        help="print the version and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands",
                                     parser_class=Parser)
    for add in SUBCOMMANDS:
        add(commands)
    return parser


def _exit_on_signal(signum, frame):
    raise SystemExit(128 + signum)  # unwinds through the launcher's clean-up


def main(argv: list[str] | None = None) -> int:
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _exit_on_signal)
    tune_for_large_heaps()
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return EXIT_HEALTHY
        return args.run(args)
    except UsageError as error:
        print(f"diag: error: {shown(str(error))}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:                  # the reader went away (diag ... | head)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("diag: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as error:               # a bug of diag's own: never read as verdicts
        if os.environ.get(DEBUG_VAR):
            traceback.print_exc()
        print(f"diag: internal error: {type(error).__name__}: {shown(str(error))} (a bug in "
              f"diag: please "
              f"report it, with the traceback {DEBUG_VAR}=1 shows)", file=sys.stderr)
        return EXIT_INTERNAL
