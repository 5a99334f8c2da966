"""The commands that read or write files only: diag logs, diag synth."""
from __future__ import annotations

import os
import sys

from diagnose.cli.common import (EXIT_ERROR, EXIT_HEALTHY, EXIT_VERDICTS, UsageError,
                                 add_command, add_output, emit_json)
from diagnose.core import schema
from diagnose.core.shown import shown


def add_logs(commands) -> None:
    parser = add_command(
        commands, "logs", "read vLLM, torchrun and NCCL logs: the first failure, its rank, "
        "and the chain after it",
        "  0    nothing beyond notes\n  1    findings (a failure, a hang, a warning)",
        ["diag logs serve.log", "diag logs rank*.log     # one log per rank, read as one job",
         "diag logs vllm.log --json | jq '.findings[0]'"],
        also_2="a file that could not be read (the others are still reported)")
    parser.add_argument("files", nargs="+", metavar="FILE",
                        help="log files, read together as one job (e.g. one log per rank)")
    add_output(parser, "the findings")
    parser.set_defaults(run=logs_command)


def logs_command(args) -> int:
    from diagnose.offline.logs import render, scan_files, to_json

    report = scan_files(args.files)
    for error in report.errors:
        print(f"diag: {shown(error)}", file=sys.stderr)
    if not report.files:
        raise UsageError("no log file could be read")
    emit_json(schema.Document.LOGS, {"files": report.files, "findings": to_json(report.findings),
                                     "dropped": report.dropped, "errors": report.errors}, args)
    if not args.json:
        render(report.findings, report.files, report.dropped)
    if report.errors:
        return EXIT_ERROR
    return EXIT_VERDICTS if report.faults else EXIT_HEALTHY


def add_synth(commands) -> None:
    parser = add_command(
        commands, "synth", "write a synthetic run dir of N ranks with a planted culprit, to "
        "try diag tui/analyze at scale", "  0    written (with --beat: after Ctrl-C)",
        ["diag synth /tmp/big --ranks 1024 --culprit 1000",
         "diag synth /tmp/big --beat        # ranks that look alive; diag tui /tmp/big elsewhere",
         "diag synth /tmp/fr --ranks 64 --fr-dumps && diag analyze /tmp/fr/fr",
         "diag synth /tmp/dp --ranks 16384 --tp 8 --dp 256 && diag analyze /tmp/dp/fr"])
    a = parser.add_argument
    a("out", help="the run dir to write (new, or empty)")
    a("--ranks", type=int, default=1024, help="TP x PP (x DP) ranks (default 1024)")
    a("--tp", type=int, default=8, help="TP size (default 8); PP = ranks / (tp x dp)")
    a("--dp", type=int, default=1, help="DP replicas (default 1). Over 1, synth writes only "
      "Flight Recorder dumps of that TP x PP x DP serving job, to OUT/fr: a probe run dir "
      "holds one engine")
    a("--fr-fault", default="missing", help="with --dp: how the culprit fails: missing "
      "(default), mismatch or stalled_send")
    a("--culprit", type=int, help="the rank that hangs (default: ranks / 2)")
    a("--kind", default="never_reached", help="how it hangs: never_reached (default), "
      "stuck_in_phase or collective_missing_peers")
    a("--fr-dumps", action="store_true",
      help="also write one Flight Recorder dump per rank to OUT/fr")
    a("--fr-entries", type=int, help="entries per dump (default 2000, torch's default "
      "ring; with --dp 64)")
    a("--beat", action="store_true", help="then keep the ranks' heartbeats moving, as in a "
      "live hung job, until Ctrl-C (without it the dir reads as a job that has ended)")
    parser.set_defaults(run=synth_command)


def synth_command(args) -> int:
    from diagnose.offline import synth, synth_fr

    culprit = args.ranks // 2 if args.culprit is None else args.culprit
    if os.path.isdir(args.out) and os.listdir(args.out):
        raise UsageError(f"{args.out}: not empty; synth writes a new run dir")
    if args.dp != 1:
        return _synth_replicas(args, culprit)
    if args.fr_entries is None:
        args.fr_entries = 2000
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


def _synth_replicas(args, culprit: int) -> int:
    """--dp over 1: Flight Recorder dumps of a TP x PP x DP serving job."""
    from diagnose.offline.synth import FR_DIR, SynthError
    from diagnose.offline.synth_fr_serving import Layout, write_serving_fr_dumps

    if args.dp < 1 or args.tp < 1 or args.ranks % (args.tp * args.dp):
        raise UsageError(f"--ranks {args.ranks} is not a multiple of --tp {args.tp} x "
                         f"--dp {args.dp}")
    layout = Layout(args.tp, args.ranks // (args.tp * args.dp), args.dp)
    out = os.path.join(args.out, FR_DIR)
    try:
        write_serving_fr_dumps(out, layout, culprit, args.fr_fault,
                               64 if args.fr_entries is None else args.fr_entries)
    except SynthError as error:
        raise UsageError(str(error)) from None
    except OSError as error:
        raise UsageError(f"{args.out}: {error.strerror}") from None
    print(f"wrote {out}: {args.ranks} Flight Recorder dumps (tp={layout.tp} x pp={layout.pp} "
          f"x dp={layout.dp}), rank {culprit} planted as {args.fr_fault}")
    print(f"try: diag analyze {out}")
    return EXIT_HEALTHY
