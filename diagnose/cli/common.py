"""What every subcommand of `diag` shares: the exit codes, the one-line usage
error, the help epilog (exit codes and examples), the parsers of flag values,
opening what a command is pointed at, and JSON out (stdout for --json, a file
for -o/--output)."""
from __future__ import annotations

import argparse
import signal
import sys

from diagnose.core import schema

EXIT_HEALTHY, EXIT_VERDICTS, EXIT_ERROR, EXIT_INTERNAL, EXIT_CRASHED = 0, 1, 2, 3, 4
EXIT_INTERRUPTED = 128 + signal.SIGINT
DEBUG_VAR = "DIAG_DEBUG"
JUDGED_CODES = """  0    healthy: no verdict
  1    at least one verdict (hang, death, mismatch or straggler)"""
COMMON_CODES = """  2    bad input: one line on stderr says why{also_2}
  3    diag itself failed (a bug): one line; DIAG_DEBUG=1 shows the traceback
  128+N  diag was ended by signal N: 130 for Ctrl-C{also}, 143 for SIGTERM"""


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def add_command(commands, name: str, summary: str, codes: str, examples: list[str],
                description: str | None = None, also_2: str = "",
                also_130: str = "") -> argparse.ArgumentParser:
    """A subcommand whose --help ends with its exit codes and examples; also_2
    and also_130: what else exits 2 (as bad input) and 130 (as Ctrl-C)."""
    common = COMMON_CODES.format(also_2=f"; also {also_2}" if also_2 else "",
                                 also=f" and {also_130}" if also_130 else "")
    epilog = (f"exit codes:\n{codes}\n{common}\n\nexamples:\n"
              + "\n".join(f"  {example}" for example in examples))
    return commands.add_parser(name, help=summary, description=description or summary,
                               epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)


def flag_value(flag: str, parse, keep_text: bool = True):
    """An argparse type: parse(text) must succeed, and its ValueError is the
    one-line message; the value is the text, or what parse made of it."""
    def value(text: str):
        try:
            parsed = parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error).removeprefix(f"{flag} ")) from None
        return text if keep_text else parsed
    return value


def add_output(parser, what: str) -> None:
    """--json and -o/--output, with the one meaning every command gives them."""
    parser.add_argument("--json", action="store_true",
                        help=f"print {what} as JSON on stdout instead of the screen "
                             f"(docs/json.md)")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help=f"also write {what} as JSON to FILE")


def emit_json(document: schema.Document, body, args) -> dict:
    """The body, stamped with its schema version, to -o's file and, with --json,
    to stdout."""
    stamped = schema.stamped(document, body)
    if args.output:
        write_json(args.output, stamped, "--output")
    if args.json:
        sys.stdout.write(schema.as_json(stamped) + "\n")
    return stamped


def write_json(path: str, body: dict, flag: str) -> None:
    try:
        with open(path, "w") as sink:
            sink.write(schema.as_json(body))
    except OSError as error:
        raise UsageError(f"{flag} {path}: {error.strerror}") from None


def open_source(path: str, prefix: str | None = None, first_read: bool = True):
    """The source of a run dir, Flight Recorder dumps or torch.distributed.debug dumps."""
    from diagnose.launch.rundir import RunDirError, open_run
    try:
        return open_run(path, prefix, first_read)
    except RunDirError as error:
        raise UsageError(str(error)) from None
