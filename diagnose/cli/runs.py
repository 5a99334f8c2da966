"""The commands that look at a run dir from outside it: diag dump (every rank's
stacks now), diag tui (watch it), diag demo (a run of its own to watch)."""
from __future__ import annotations

import functools
import importlib.util
import sys

from diagnose.cli.common import (EXIT_HEALTHY, UsageError, add_command, add_output, emit_json,
                                 open_source)
from diagnose.core import schema


def add_dump(commands) -> None:
    parser = add_command(
        commands, "dump", "stacks of every rank of a live run, now: the probe's own, and "
        "py-spy's from outside", "  0    dumped (ranks that did not answer are notes)",
        ["diag dump runs/20250101-120000",
         "diag dump RUN_DIR --native      # py-spy's stacks with C/C++ frames, marked [native]",
         "diag dump RUN_DIR --json | jq '.stacks'"])
    parser.add_argument("run_dir", help="the run dir of a live diag launch")
    parser.add_argument("--native", action="store_true",
                        help="also show py-spy's stacks with native (C/C++) frames, marked "
                             "as such; needs ptrace rights over the ranks")
    add_output(parser, "the stacks")
    parser.set_defaults(run=dump_command)


def dump_command(args) -> int:
    from diagnose.launch.dump import dump_run, render_dump
    open_source(args.run_dir)  # one-line errors for a missing or foreign dir
    try:
        dumped = dump_run(args.run_dir, native=args.native)
    except OSError as error:
        raise UsageError(f"cannot write the dump into {args.run_dir}: "
                         f"{error.strerror or error}") from None
    body = emit_json(schema.Document.DUMP, dumped, args)
    if not args.json:
        render_dump(body)
    return EXIT_HEALTHY


def add_tui(commands) -> None:
    parser = add_command(commands, "tui", "watch a run dir live: which rank is stuck where, "
                         "and why", "  0    the TUI was closed",
                         ["diag tui runs/20250101-120000", "diag tui /tmp/big   # after "
                          "diag synth /tmp/big --beat"])
    parser.add_argument("run_dir", help="the run dir of a live or finished run, or a "
                                        "directory of Flight Recorder dumps")
    parser.set_defaults(run=tui_command)


def tui_command(args) -> int:
    source = open_source(args.run_dir, first_read=False)   # the TUI shows diag launch's verdict first
    print(f"diag: opening the TUI on {args.run_dir}…", file=sys.stderr, flush=True)
    from tui.app import DiagApp
    DiagApp(source).run()
    return EXIT_HEALTHY


def add_demo(commands) -> None:
    parser = add_command(commands, "demo", "watch a hang being found: tiny-llama at tp=2 "
                         "pp=4 on the CPU, rank 6 never reaches execute_model",
                         "  0    the demo named its culprit (rank 6; with --real, rank 3)\n"
                         "  1    it did not (a bug: please report it)",
                         ["diag demo", "diag demo --no-tui --run-dir /tmp/demo", "diag demo --real"])
    parser.add_argument("--run-dir", help="where the demo's run goes (default: "
                                          "runs/demo-<time>)")
    parser.add_argument("--no-tui", action="store_true", help="plain live view even on a terminal")
    parser.add_argument("--real", action="store_true",
                        help="the embedded SmolLM2-135M (real weights) at tp=3 pp=2, rank 3 hanging, "
                             "instead of tiny-llama (random weights)")
    parser.set_defaults(run=demo_command)


def demo_command(args) -> int:
    from diagnose.cli.launch_tui import run_with_tui
    from diagnose.launch.claim import RunDirError
    from diagnose.launch.demo import run_demo
    from diagnose.launch.live import run_with_live_view
    if importlib.util.find_spec("torch") is None:
        raise UsageError("diag demo runs the engine, which needs torch: "
                         "pip install 'hangscope[engine]' (or ./setup.sh in a checkout)")
    tui = not args.no_tui and sys.stdout.isatty()
    watch = functools.partial(run_with_tui, stop_on_exit=True) if tui else run_with_live_view
    try:
        return run_demo(args.run_dir, watch, tui, real=args.real)
    except RunDirError as error:
        raise UsageError(str(error)) from None
