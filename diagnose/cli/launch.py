"""diag launch -- CMD ...: run a command with the probe on in every rank, watch
it, and name the culprit when it hangs."""
from __future__ import annotations

import argparse
from dataclasses import replace

from diagnose.analysis.thresholds import Thresholds
from diagnose.cli.common import UsageError, add_command, flag_value
from diagnose.launch.escalate import OnHang
from diagnose.probe import rank_env
from diagnose.probe.faults import parse_faults
from diagnose.probe.marks import parse_mark

MIN_LAUNCH_STALL_S = 0.5   # below it, diag launch would call a healthy run hung
CODES = """  0    healthy: no verdict, and the command exited 0
  1    at least one verdict: a hang (ended by --on-hang kill or not), a mismatch, a straggler
  4    the job crashed with no hang: a rank died, or the command exited non-zero or was
       killed (never the command's own code: that is in the report, and in one line)"""
EXAMPLES = ["diag launch -- python -m engine serve --model smollm2-135m",
            "diag launch --tui -- torchrun --nproc-per-node 4 train.py",
            "diag launch --on-hang kill -o report.json -- vllm serve MODEL -tp 2 -pp 2",
            "diag launch --fault rank=6,at=execute_model,kind=hang -- python -m engine "
            "generate -tp 2 -pp 4 --prompt hi"]


def add_launch(commands) -> None:
    parser = add_command(commands, "launch", "run a command with probes on in every rank; "
                         "name the culprit when it hangs", CODES, EXAMPLES,
                         also_130="the TUI's stop")
    _launch_options(parser)
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...",
                        help="the command to run, after --")
    parser.set_defaults(run=launch_command)


def _launch_thresholds(text: str) -> Thresholds:
    thresholds = Thresholds.parse(text)
    if thresholds.stall_s is not None and thresholds.stall_s < MIN_LAUNCH_STALL_S:
        raise ValueError(f"--stall-timeout must be 'auto' or at least {MIN_LAUNCH_STALL_S:g} s "
                         f"for diag launch (less calls a healthy run hung at its first slow "
                         f"step), not {text!r}")
    return thresholds


def _compile_limit(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise ValueError(f"--compile-limit must be seconds > 0, not {text!r}")
    return seconds


def _cpu_stretch(text: str) -> float:
    try:
        times = float(text)
    except ValueError:
        times = 0.0
    if not 1 <= times < float("inf"):
        raise ValueError(f"--cpu-stretch must be a number >= 1 (1: no stretch), not {text!r}")
    return times


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}")
    return int(text)


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 0-65535, not {text!r}")
    return int(text)


def _launch_options(parser) -> None:
    a = parser.add_argument
    a("--run-dir", help="where probes, dumps and the report go (default: runs/<time>)")
    a("--stall-timeout", default="auto", metavar="SECONDS|auto",
      type=flag_value("--stall-timeout", _launch_thresholds, keep_text=False),
      help=f"seconds without progress that make a hang, at least {MIN_LAUNCH_STALL_S:g} "
           f"(default: auto, learned from the run)")
    a("--compile-limit", default=600.0, metavar="SECONDS",
      type=flag_value("--compile-limit", _compile_limit, keep_text=False),
      help="a rank compiling (Dynamo, Inductor, a compiler child) is no hang for this long; "
           "past it, a compile_too_long verdict (default: 600)")
    a("--cpu-stretch", default=Thresholds.cpu_stretch, metavar="TIMES",
      type=flag_value("--cpu-stretch", _cpu_stretch, keep_text=False),
      help="a rank that waited for a CPU while it stalled (a loaded host) gets that time on "
           "top of its stall limit, up to TIMES times the limit (default: %(default)g; "
           "1: no stretch)")
    a("--on-hang", default="report", metavar="ACTIONS",
      type=flag_value("--on-hang", OnHang.parse),
      help="on a hang: capture stacks, Flight Recorder dumps and the report, and keep "
           "running (report, the default; also 'dump'); then end the job (kill), or end it "
           "SECONDS later (kill:SECONDS); run a hook with the report's path (exec:CMD, last); "
           "or only watch (wait). Comma-separated: dump,exec:notify.sh,kill:30")
    a("--launch-blocking", metavar="RANKS|all", type=flag_value("--launch-blocking",
                                                                 rank_env.parse_ranks),
      help="CUDA_LAUNCH_BLOCKING=1 on these ranks only, e.g. 0,3 or 0-3")
    a("--relaunch-on-cuda-error", action="store_true",
      help="when a rank dies of a CUDA error, run once more with CUDA_LAUNCH_BLOCKING=1 "
           "on it and report both error sites")
    a("--nccl-debug", metavar="LEVEL", help="NCCL_DEBUG level, one file per rank in the run dir")
    a("--fault", action="extend", default=[], metavar="SPEC",
      type=flag_value("--fault", parse_faults, keep_text=False),
      help="inject a fault: rank=R,at=PHASE[,step=N],kind=hang|sleep:S|crash|exit:C|"
           "skip_collective|skip_broadcast|raise (repeatable)")
    a("-o", "--output", metavar="FILE",
      help="also write the report's JSON (report.json, docs/json.md) to FILE")
    a("--json-report", dest="output", help=argparse.SUPPRESS)   # -o's name before, kept for scripts
    a("--mark", action="append", default=[], metavar="MODULE:NAME[=PHASE]",
      type=flag_value("--mark", parse_mark),
      help="make calls of this function a phase, e.g. "
           "vllm.v1.worker.gpu_worker:Worker.execute_model (repeatable)")
    a("--tui", action="store_true", help="show the live TUI in front of the command")
    a("--nnodes", type=_count, default=1, help="nodes of a multi-node job: one diag launch "
      "per node, sharing the token in $DIAG_NODE_TOKEN (default 1)")
    a("--node-rank", type=_count, default=0, help="this node's rank; node 0 is the head")
    a("--listen", metavar="HOST:PORT", help="the head: where the other nodes report to")
    a("--head", metavar="HOST:PORT", help="another node: the head's --listen address")
    a("--metrics-port", metavar="PORT", type=_port,
      help="serve Prometheus metrics (/metrics) and a health check (/health: 503 while a hang "
           "is named) on this port; 0 picks a free one (docs/metrics.md)")
    a("--metrics-address", metavar="ADDR", default="127.0.0.1",
      help="the address --metrics-port listens on (default 127.0.0.1; 0.0.0.0 for a "
           "Kubernetes probe or a Prometheus on another host)")


def launch_command(args) -> int:
    from diagnose.launch.claim import RunDirError
    from diagnose.launch.launcher import LaunchError, Launcher
    from diagnose.cli.launch_tui import run_with_tui
    from diagnose.launch.live import print_outcome, run_with_live_view
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


def _launch_options_of(args, command: list[str]):
    from diagnose.launch.options import LaunchOptions, default_run_dir
    return LaunchOptions(command=command, run_dir=args.run_dir or default_run_dir(),
                         thresholds=replace(args.stall_timeout, compile_s=args.compile_limit,
                                            cpu_stretch=args.cpu_stretch),
                         on_hang=args.on_hang,
                         launch_blocking=args.launch_blocking, nccl_debug=args.nccl_debug,
                         faults=args.fault, output=args.output, marks=args.mark,
                         nnodes=args.nnodes, node_rank=args.node_rank, listen=args.listen,
                         head=args.head, metrics=None if args.metrics_port is None else
                         (args.metrics_address, args.metrics_port))
