"""diag analyze PATH: the post-mortem of a run dir, of PyTorch Flight Recorder
dumps, or of torch.distributed.debug's dump directory; the content decides which.
Dumps are written once a job is already stuck, so there every wait counts as a
hang unless --stall-timeout says otherwise; a run dir uses the learned limits."""
from __future__ import annotations

import json
import os
from dataclasses import asdict

from diagnose.analysis.thresholds import Thresholds
from diagnose.cli.common import (EXIT_CRASHED, EXIT_HEALTHY, EXIT_VERDICTS, JUDGED_CODES,
                                 UsageError, add_command, add_output, emit_json, flag_value,
                                 open_source)
from diagnose.core import schema
from diagnose.core.heap import gc_paused
from diagnose.core.layout import parse_ranks, rank_list

EXAMPLES = ["diag analyze runs/20250101-120000",
            "diag analyze /tmp/fr_dumps --ranks 0-3,6 --groups tp1",
            "diag analyze /tmp/fr_dumps -p nccl_trace_rank_ --json > verdicts.json",
            "diag analyze /tmp/debug_dumps          # torch.distributed.debug's dump_dir",
            "diag analyze RUN_DIR --perfetto trace.json   # open it in ui.perfetto.dev"]


def add_analyze(commands) -> None:
    parser = add_command(commands, "analyze", "name the culprit of a hang from a run dir, "
                         "Flight Recorder dumps or torch.distributed.debug dumps",
                         JUDGED_CODES, EXAMPLES, description=__doc__.split("\n\n")[0],
                         also_2="a probe file that could not be read, when there is no verdict")
    a = parser.add_argument
    a("path", help="a run dir, a directory of Flight Recorder dumps, or torch.distributed"
                   ".debug's dump_dir")
    add_output(parser, "the verdicts and the ranks shown")
    a("--perfetto", metavar="FILE", help="also write a Chrome/Perfetto trace of every rank")
    a("--stall-timeout", metavar="SECONDS|auto", type=flag_value(
        "--stall-timeout", Thresholds.parse, keep_text=False),
      help="seconds without progress that make a hang (default: auto for a run dir, 0 for "
           "dumps)")
    a("--ranks", metavar="RANKS", type=flag_value("--ranks", parse_ranks, keep_text=False),
      help="show only these ranks, e.g. 0-3,6 (torchfrtrace's --selected-ranks); the "
           "analysis still judges every rank")
    a("--groups", metavar="GROUP[,GROUP]", type=lambda text: text.split(","),
      help="show only the ranks of these process groups and their calls there: diag's "
           "names (tp0, world) or torch's pg name or desc (torchfrtrace's --pg-filters)")
    a("-p", "--prefix", metavar="PREFIX",
      help="Flight Recorder dumps are the files named PREFIX<rank>, e.g. nccl_trace_rank_ "
           "(torchfrtrace's -p; default: any file whose name ends in its rank)")
    parser.set_defaults(run=analyze_command)


def analyze_command(args) -> int:
    from diagnose.analysis.crash import crash_of
    from diagnose.launch import first_failure
    from diagnose.offline.report import render, to_json
    from diagnose.offline.selection import Selection, SelectionError

    with gc_paused():
        source = open_source(args.path, args.prefix)
        snapshot, notes = source.snapshot(), source.notes
        verdicts = source.verdicts(snapshot, args.stall_timeout)
    selection = Selection(args.ranks, args.groups)
    try:
        rows = selection.rows(snapshot, verdicts, source.group_names)
    except SelectionError as error:
        raise UsageError(str(error)) from None
    if args.perfetto:
        _write_perfetto(snapshot, args.perfetto)
    crash = crash_of(snapshot)
    if crash is not None and os.path.isdir(snapshot.run_dir):
        crash = first_failure.worded(crash, first_failure.first_failure(snapshot.run_dir, snapshot))
    recorded = _flight_recorder(source)
    if args.json or args.output:
        body = to_json(snapshot, verdicts, rows, crash) | {"notes": notes}
        if selection.narrows:
            body["shown"] = selection.to_json(rows, snapshot)
        if recorded is not None:
            body["flight_recorder"] = recorded
        emit_json(schema.Document.ANALYZE, body, args)
    if not args.json:
        render(snapshot, verdicts, notes=notes, rows=rows,
               caption=selection.caption(rows, snapshot), crash=crash)
        if recorded is not None:
            _render_flight_recorder(recorded)
    if verdicts:
        return EXIT_VERDICTS
    if source.unreadable:
        raise UsageError(f"no verdict, but the run cannot be called healthy: "
                         f"{len(source.unreadable)} probe file(s) could not be read "
                         f"({source.unreadable[0]})")
    return EXIT_CRASHED if crash is not None else EXIT_HEALTHY


def _flight_recorder(source) -> dict | None:
    """A run dir's Flight Recorder dumps (diag launch asks for them on a hang),
    judged on their own: the ranks they hold and what they say."""
    from diagnose.launch.flight import FR_DIR, dumps_in
    from diagnose.launch.rundir import RunDirError, RunDirSource, open_run
    if not isinstance(source, RunDirSource) or not dumps_in(source.run_dir):
        return None
    path = os.path.join(source.run_dir, FR_DIR)
    try:
        dumps = open_run(path)
    except RunDirError as error:
        return {"path": path, "ranks": [], "verdicts": [], "notes": [str(error)]}
    snapshot = dumps.snapshot()
    return {"path": path, "ranks": sorted(snapshot.ranks),
            "verdicts": [asdict(verdict) for verdict in dumps.verdicts(snapshot)],
            "notes": dumps.notes}


def _render_flight_recorder(recorded: dict) -> None:
    from rich.text import Text

    from diagnose.offline.console import output_console
    console = output_console(highlight=False)
    ranks = rank_list(recorded["ranks"]) if recorded["ranks"] else "no rank readable"
    console.print(Text(f"Flight Recorder dumps in {recorded['path']} ({ranks}; "
                       f"diag analyze {recorded['path']} shows them whole):", style="bold"))
    for verdict in recorded["verdicts"]:
        console.print(Text(f"  [{verdict['kind']}] {verdict['summary']}"))
    if not recorded["verdicts"]:
        console.print(Text("  no hang in the dumps"))
    for note in recorded["notes"]:
        console.print(Text(f"  note: {note}", style="dim"))


def _write_perfetto(snapshot, path: str) -> None:
    from diagnose.offline.perfetto import to_perfetto
    try:
        with open(path, "w") as sink:
            json.dump(schema.stamped(schema.Document.TRACE, to_perfetto(snapshot)), sink)
    except OSError as error:
        raise UsageError(f"--perfetto {path}: {error.strerror}") from None
