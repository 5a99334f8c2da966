"""diag attach PID: a job that is hung now, started without diag: its ranks found
under PID, their stacks sampled with py-spy, the culprit named by the one
analysis, and a run dir that diag analyze and diag tui open."""
from __future__ import annotations

import argparse
import os
import sys
import time

from diagnose.cli.common import (EXIT_HEALTHY, EXIT_VERDICTS, JUDGED_CODES,
                                 UsageError, add_command, add_output, emit_json)
from diagnose.core import schema

EXAMPLES = ["diag attach 4242                # the pid of vllm serve, torchrun, python -m engine",
            "diag attach 4242 --json > report.json",
            "diag attach 4242 --kill         # end the job once the report is written",
            "diag attach --tui 4242          # watch it, sampling on"]


def add_attach(commands) -> None:
    parser = add_command(commands, "attach", "name the culprit of a job that is hung now, "
                         "started without diag: its ranks' stacks from outside (py-spy)",
                         JUDGED_CODES, EXAMPLES, description=__doc__.split("\n\n")[0],
                         also_2="no ptrace rights over the job (one line names what would "
                                "give them)")
    a = parser.add_argument
    a("pid", type=_pid, help="vllm serve, a torchrun agent, python -m engine, or any parent "
                             "of the ranks")
    a("--run-dir", help="where the snapshot and the report go (default: runs/attach-<time>)")
    a("--rounds", type=_count, default=4, help="stacks taken of each process (default 4)")
    a("--interval", type=_seconds, default=0.75, metavar="SECONDS",
      help="between two rounds (default 0.75)")
    a("--no-native", action="store_true", help="Python frames only (py-spy without --native)")
    a("--tui", action="store_true", help="open the live TUI, sampling on")
    a("--kill", action="store_true", help="end the job (SIGTERM, then SIGKILL) once the "
                                          "report is written; without it diag never signals it")
    add_output(parser, "the report")
    parser.set_defaults(run=attach_command)


def attach_command(args) -> int:
    from diagnose.attach.render import render_attached
    from diagnose.attach.run import AttachError, AttachOptions, attach, write_run_dir
    run_dir = args.run_dir or os.path.join("runs", time.strftime("attach-%Y%m%d-%H%M%S"))
    opts = AttachOptions(args.pid, os.path.abspath(run_dir), args.rounds, args.interval,
                         native=not args.no_native)
    try:
        attached = attach(opts)
        body = write_run_dir(attached, opts.run_dir)
    except AttachError as error:
        raise UsageError(str(error)) from None
    if args.tui:
        attached = _tui(opts, attached)
    else:
        emit_json(schema.Document.REPORT, body, args)
        if not args.json:
            render_attached(attached, opts.run_dir)
    if args.kill:
        _kill(args.pid)
    return EXIT_VERDICTS if attached.verdicts else EXIT_HEALTHY


def _tui(opts, attached):
    """The live TUI until it is closed; what it last sampled."""
    from diagnose.attach.live import AttachSource
    from tui.app import DiagApp
    source = AttachSource(opts, attached)
    DiagApp(source).run()
    return source.attached


def _kill(pid: int) -> None:
    from diagnose.attach.run import end_job
    ended = end_job(pid)
    print(f"diag: ended the job: pid {pid} and {max(0, ended - 1)} processes under it",
          file=sys.stderr)


def _pid(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 1 << 31:
        raise _bad(f"not a process id: {text[:40]!r}")
    return int(text)


def _count(text: str) -> int:
    if not text.isdigit() or not 2 <= int(text) <= 100:
        raise _bad(f"--rounds: give a whole number from 2 to 100, not {text[:40]!r}")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.05 <= value <= 60:
        raise _bad(f"--interval: give seconds from 0.05 to 60, not {text[:40]!r}")
    return value


def _bad(message: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(message)
