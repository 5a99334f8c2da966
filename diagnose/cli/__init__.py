"""The `diag` command: one subcommand per job.

    diag analyze PATH [--json] [--perfetto FILE] [--stall-timeout SECONDS|auto]

PATH is a run dir (the probes' *.probe files) or a directory of PyTorch Flight
Recorder dumps; the content decides which. Flight Recorder dumps are written
once a job is already stuck, so there every wait counts as a hang unless
--stall-timeout says otherwise; a run dir uses the learned limits (auto).

Exit codes of diag analyze (and logs):
    0   analysed: no verdict (healthy)
    1   analysed: at least one verdict (hang, death, mismatch or straggler)
    2   bad usage or unreadable input; one line on stderr says why
    3   diag itself failed (a bug): one line, the traceback with DIAG_DEBUG=1
diag launch exits with the command's own code (128 + N when signal N ended it),
86 when it ended a hung run, 128 + N when signal N stopped it (130: Ctrl-C, or
"stop" in the TUI), and 2 or 3 as above.

A subcommand is a function that adds its parser to `commands` and sets
`run` to the function that carries it out; add it to SUBCOMMANDS.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import sys
import traceback

from diagnose.analysis.thresholds import Thresholds
from diagnose.probe import rank_env
from diagnose.probe.faults import parse_faults
from diagnose.probe.marks import parse_mark

EXIT_HEALTHY, EXIT_VERDICTS, EXIT_ERROR, EXIT_INTERNAL = 0, 1, 2, 3
EXIT_INTERRUPTED = 128 + signal.SIGINT
DEBUG_VAR = "DIAG_DEBUG"
MIN_LAUNCH_STALL_S = 0.5   # below it, diag launch would call a healthy run hung
EXIT_CODES = """exit codes:
  0      analyze, logs: healthy
  1      analyze, logs: verdicts found
  2      bad input; one line on stderr says why
  3      diag itself failed (a bug); DIAG_DEBUG=1 shows the traceback
  launch: the command's own code (128+N when signal N ended it), 86 when it
  ended a hung run, 128+N when signal N stopped it (130: Ctrl-C or the TUI's stop)"""


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def add_analyze(commands) -> None:
    parser = commands.add_parser("analyze", help="name the culprit of a hang from a run dir "
                                                 "or Flight Recorder dumps")
    parser.add_argument("path", help="run dir, or directory of Flight Recorder dumps")
    parser.add_argument("--json", action="store_true", help="print verdicts and ranks as JSON")
    parser.add_argument("--perfetto", metavar="FILE", help="also write a Chrome/Perfetto trace")
    parser.add_argument("--stall-timeout", metavar="SECONDS|auto", type=_thresholds,
                        help="seconds without progress that make a hang (default: auto for a "
                             "run dir, 0 for Flight Recorder dumps)")
    parser.set_defaults(run=analyze_command)


def analyze_command(args) -> int:
    from diagnose.offline.report import render, to_json

    source = _open(args.path)
    snapshot, notes = source.snapshot(), source.notes
    verdicts = source.verdicts(snapshot, args.stall_timeout)
    if args.perfetto:
        _write_perfetto(snapshot, args.perfetto)
    if args.json:
        print(json.dumps(to_json(snapshot, verdicts) | {"notes": notes}, indent=2))
    else:
        render(snapshot, verdicts, notes=notes)
    return EXIT_VERDICTS if verdicts else EXIT_HEALTHY


def _flag_value(flag: str, parse, keep_text: bool = True):
    """An argparse type: parse(text) must succeed, and its ValueError is the
    one-line message; the value is the text, or what parse made of it."""
    def value(text: str):
        try:
            parsed = parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error).removeprefix(f"{flag} ")) from None
        return text if keep_text else parsed
    return value


def _launch_thresholds(text: str) -> Thresholds:
    thresholds = Thresholds.parse(text)
    if thresholds.stall_s is not None and thresholds.stall_s < MIN_LAUNCH_STALL_S:
        raise ValueError(f"--stall-timeout must be 'auto' or at least {MIN_LAUNCH_STALL_S:g} s "
                         f"for diag launch (less calls a healthy run hung at its first slow "
                         f"step), not {text!r}")
    return thresholds


_thresholds = _flag_value("--stall-timeout", Thresholds.parse, keep_text=False)
_launch_stall = _flag_value("--stall-timeout", _launch_thresholds, keep_text=False)
_ranks = _flag_value("--launch-blocking", rank_env.parse_ranks)
_fault = _flag_value("--fault", parse_faults, keep_text=False)
_mark = _flag_value("--mark", parse_mark)


def _open(path: str):
    """The source of a run dir or a directory of Flight Recorder dumps."""
    from diagnose.launch.rundir import RunDirError, open_run
    try:
        return open_run(path)
    except RunDirError as error:
        raise UsageError(str(error)) from None


def _write_perfetto(snapshot, path: str) -> None:
    from diagnose.offline.perfetto import to_perfetto
    try:
        with open(path, "w") as sink:
            json.dump(to_perfetto(snapshot), sink)
    except OSError as error:
        raise UsageError(f"--perfetto {path}: {error.strerror}") from None


def add_tui(commands) -> None:
    parser = commands.add_parser("tui", help="watch a run dir live: which rank is stuck where, and why")
    parser.add_argument("run_dir", help="the run dir of a live or finished run")
    parser.set_defaults(run=tui_command)


def tui_command(args) -> int:
    from tui.app import DiagApp
    DiagApp(_open(args.run_dir)).run()
    return EXIT_HEALTHY


def add_launch(commands) -> None:
    parser = commands.add_parser("launch", help="run a command with probes on in every rank; "
                                                "name the culprit when it hangs",
                                 epilog=EXIT_CODES,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    _launch_options(parser)
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...",
                        help="the command to run, after --")
    parser.set_defaults(run=launch_command)


def _launch_options(parser) -> None:
    a = parser.add_argument
    a("--run-dir", help="where probes, dumps and the report go (default: runs/<time>)")
    a("--stall-timeout", default="auto", metavar="SECONDS|auto", type=_launch_stall,
      help=f"seconds without progress that make a hang, at least {MIN_LAUNCH_STALL_S:g} "
           f"(default: auto, learned from the run)")
    a("--on-hang", choices=["report", "kill", "wait"], default="report",
      help="on a hang: dump and report, then keep running (report); also end the run (kill); "
           "only watch (wait)")
    a("--launch-blocking", metavar="RANKS|all", type=_ranks,
      help="CUDA_LAUNCH_BLOCKING=1 on these ranks only")
    a("--relaunch-on-cuda-error", action="store_true",
      help="when a rank dies of a CUDA error, run once more with CUDA_LAUNCH_BLOCKING=1 "
           "on it and report both error sites")
    a("--nccl-debug", metavar="LEVEL", help="NCCL_DEBUG level, one file per rank in the run dir")
    a("--fault", action="extend", default=[], type=_fault, metavar="SPEC",
      help="inject a fault: rank=R,at=PHASE[,step=N],kind=hang|sleep:S|crash|exit:C|"
           "skip_collective|skip_broadcast (repeatable)")
    a("--json-report", metavar="FILE", help="also write the report's JSON here")
    a("--mark", action="append", default=[], type=_mark, metavar="MODULE:NAME[=PHASE]",
      help="make calls of this function a phase, e.g. "
           "vllm.v1.worker.gpu_worker:Worker.execute_model (repeatable)")
    a("--tui", action="store_true", help="show the live TUI in front of the command")
    a("--nnodes", type=_count, default=1, help="nodes of a multi-node job: one diag launch "
      "per node, sharing the token in $DIAG_NODE_TOKEN (default 1)")
    a("--node-rank", type=_count, default=0, help="this node's rank; node 0 is the head")
    a("--listen", metavar="HOST:PORT", help="the head: where the other nodes report to")
    a("--head", metavar="HOST:PORT", help="another node: the head's --listen address")


def launch_command(args) -> int:
    from diagnose.launch.claim import RunDirError
    from diagnose.launch.launcher import LaunchError, Launcher
    from diagnose.launch.live import print_outcome, run_with_live_view, run_with_tui
    from diagnose.launch.nodes import NodeError

    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not command:
        raise UsageError("launch needs a command after --, e.g. diag launch -- python -m engine serve")
    _check_nodes(args)
    try:
        launcher = Launcher(_launch_options_of(args, command))
        outcome = run_with_tui(launcher) if args.tui else run_with_live_view(launcher)
    except (RunDirError, LaunchError, NodeError) as error:  # NodeError: the head refused us
        raise UsageError(str(error)) from None
    print_outcome(launcher, outcome)
    if args.relaunch_on_cuda_error:
        from diagnose.launch.cuda_relaunch import relaunch_on_cuda_error
        relaunch_on_cuda_error(launcher)
    return outcome.exit_code


def _check_nodes(args) -> None:
    if args.nnodes < 1 or args.node_rank >= args.nnodes:
        raise UsageError(f"--node-rank must be in 0..{args.nnodes - 1} (--nnodes {args.nnodes})")
    if args.nnodes == 1 and (args.listen or args.head):
        raise UsageError("--listen and --head are for multi-node launches (--nnodes 2 or more)")
    if args.nnodes > 1 and args.node_rank == 0 and not args.listen:
        raise UsageError("node 0 is the head of a multi-node launch: give --listen HOST:PORT")
    if args.node_rank > 0 and not args.head:
        raise UsageError(f"node {args.node_rank} reports to the head: give --head HOST:PORT")
    if args.node_rank > 0 and args.listen:
        raise UsageError("only the head (--node-rank 0) listens")
    if args.node_rank == 0 and args.head:
        raise UsageError("the head (--node-rank 0) takes --listen, not --head")


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}")
    return int(text)


def _launch_options_of(args, command: list[str]):
    from diagnose.launch.launcher import LaunchOptions, default_run_dir
    return LaunchOptions(command=command, run_dir=args.run_dir or default_run_dir(),
                         thresholds=args.stall_timeout, on_hang=args.on_hang,
                         launch_blocking=args.launch_blocking, nccl_debug=args.nccl_debug,
                         faults=args.fault, json_report=args.json_report, marks=args.mark,
                         nnodes=args.nnodes, node_rank=args.node_rank, listen=args.listen,
                         head=args.head)


def add_dump(commands) -> None:
    parser = commands.add_parser("dump", help="stacks of every rank of a live run, now")
    parser.add_argument("run_dir")
    parser.add_argument("--native", action="store_true", help="py-spy with native frames")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(run=dump_command)


def dump_command(args) -> int:
    from diagnose.launch.dump import dump_run, render_dump
    _open(args.run_dir)  # one-line errors for a missing or foreign dir
    body = dump_run(args.run_dir, native=args.native)
    if args.json:
        print(json.dumps(body, indent=1))
    else:
        render_dump(body)
    return EXIT_HEALTHY


def add_demo(commands) -> None:
    parser = commands.add_parser("demo", help="watch a hang being found: tiny-llama at tp=2 "
                                              "pp=4 on the CPU, rank 6 never reaches execute_model")
    parser.add_argument("--run-dir", help="default: runs/demo-<time>")
    parser.add_argument("--no-tui", action="store_true", help="plain live view even on a terminal")
    parser.set_defaults(run=demo_command)


def demo_command(args) -> int:
    from diagnose.launch.claim import RunDirError
    from diagnose.launch.demo import run_demo
    if importlib.util.find_spec("torch") is None:
        raise UsageError("diag demo runs the engine, which needs torch: "
                         "pip install 'hangscope[engine]' (or ./setup.sh in a checkout)")
    try:
        return run_demo(args.run_dir, use_tui=not args.no_tui)
    except RunDirError as error:
        raise UsageError(str(error)) from None


def add_logs(commands) -> None:
    parser = commands.add_parser("logs", help="read vLLM, torchrun and NCCL logs: the first "
                                              "failure, its rank, and the chain after it")
    parser.add_argument("files", nargs="+", metavar="FILE",
                        help="log files, read together as one job (e.g. one log per rank)")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.set_defaults(run=logs_command)


def logs_command(args) -> int:
    """Exit 0: no finding beyond notes; 1: findings; 2: a file could not be read (the
    others are still read and reported)."""
    from diagnose.offline.logs import render, scan_files, to_json

    report = scan_files(args.files)
    for error in report.errors:
        print(f"diag: {error}", file=sys.stderr)
    if not report.files:
        raise UsageError("no log file could be read")
    if args.json:
        print(json.dumps(to_json(report.findings), indent=1))
    else:
        render(report.findings, report.files, report.dropped)
    if report.errors:
        return EXIT_ERROR
    return EXIT_VERDICTS if report.faults else EXIT_HEALTHY


def add_synth(commands) -> None:
    parser = commands.add_parser("synth", help="write a synthetic run dir of N ranks with a "
                                               "planted culprit, to try diag tui/analyze at scale")
    parser.add_argument("out", help="the run dir to write (new, or empty)")
    parser.add_argument("--ranks", type=int, default=1024, help="TP x PP ranks (default 1024)")
    parser.add_argument("--tp", type=int, default=8, help="TP size (default 8); PP = ranks / tp")
    parser.add_argument("--culprit", type=int, help="the rank that hangs (default: ranks / 2)")
    parser.add_argument("--kind", default="never_reached",
                        help="how it hangs: never_reached (default), stuck_in_phase or "
                             "collective_missing_peers")
    parser.add_argument("--fr-dumps", action="store_true",
                        help="also write one Flight Recorder dump per rank to OUT/fr")
    parser.add_argument("--fr-entries", type=int, default=2000,
                        help="entries per dump (default 2000, torch's default ring)")
    parser.add_argument("--beat", action="store_true",
                        help="then keep the ranks' heartbeats moving, as in a live hung job, "
                             "until Ctrl-C")
    parser.set_defaults(run=synth_command)


def synth_command(args) -> int:
    from diagnose.offline import synth, synth_fr

    culprit = args.ranks // 2 if args.culprit is None else args.culprit
    if os.path.isdir(args.out) and os.listdir(args.out):
        raise UsageError(f"{args.out}: not empty; synth writes a new run dir")
    try:
        job = synth.hung_job(args.ranks, args.tp, culprit, args.kind)
        if args.fr_dumps:
            synth_fr.write_fr_dumps(os.path.join(args.out, synth.FR_DIR), args.ranks, args.tp,
                                 culprit, args.fr_entries)
        run = synth.write_run_dir(job.snapshot(), args.out)
    except synth.SynthError as error:
        raise UsageError(str(error)) from None
    except OSError as error:
        raise UsageError(f"{args.out}: {error.strerror}") from None
    print(f"wrote {args.out}: {args.ranks} ranks (tp={args.tp} x pp={args.ranks // args.tp}), "
          f"rank {culprit} planted as {args.kind}")
    if args.fr_dumps:
        print(f"wrote {os.path.join(args.out, synth.FR_DIR)}: {args.ranks} Flight Recorder "
              f"dumps of {args.fr_entries} entries, rank {culprit} missed a TP all_reduce")
    print(f"try: diag tui {args.out}   or   diag analyze {args.out}")
    if args.beat:
        print("beating: the ranks look alive while this runs; Ctrl-C to stop", flush=True)
        try:
            run.beat_forever()
        except KeyboardInterrupt:
            pass
    return EXIT_HEALTHY


SUBCOMMANDS = (add_launch, add_analyze, add_dump, add_demo, add_tui, add_logs, add_synth)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="diag", description="Find the rank at the root of a hang in "
                                              "tensor- and pipeline-parallel LLM serving.",
                     epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     parser_class=_Parser)
    for add in SUBCOMMANDS:
        add(commands)
    return parser


def _exit_on_signal(signum, frame):
    raise SystemExit(128 + signum)  # unwinds through the launcher's clean-up


def main(argv: list[str] | None = None) -> int:
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _exit_on_signal)
    try:
        args = build_parser().parse_args(argv)
        return args.run(args)
    except UsageError as error:
        print(f"diag: error: {error}", file=sys.stderr)
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
        print(f"diag: internal error: {type(error).__name__}: {error} (a bug in diag: please "
              f"report it, with the traceback {DEBUG_VAR}=1 shows)", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
