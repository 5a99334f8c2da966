"""diag's own lines in a captured output. `diag launch` writes them into the
job's output (output.log, and the terminal a capture records), each starting
"diag: ": a verdict, "diag: KIND: SUMMARY", is a finding of its own, with the
rank it names first; "diag: --- diag ended the job here (...) ---" is diag's
stop, and what the job printed after it (torchrun's SignalException, ranks
losing their peers) is its being stopped, never a failure."""
from __future__ import annotations

import re

from diagnose.core.vocab import VerdictKind
from diagnose.offline.logs.model import Finding, Kind, Severity
from diagnose.offline.logs.words import finding

ENDED = "diag: --- diag ended the job here"
VERDICT = re.compile(r"^diag: (?P<kind>" + "|".join(kind.value for kind in VerdictKind)
                     + r"): (?P<summary>.+)$")
FIRST_RANK = re.compile(r"^rank (\d+)\b")
SEVERITY = {VerdictKind.STRAGGLER: Severity.WARNING, VerdictKind.DEAD: Severity.FAILURE}
VERDICT_ADVICE = ("diag launch's verdict, from the ranks' probes: its report.json in the run "
                  "dir has every rank's stacks (diag analyze RUN_DIR)")
STOPPED_ADVICE = "diag stopped the job there: part of stopping it, not a failure"


def read(scan, line, proc) -> None:
    body = line.body.strip()
    if body.startswith(ENDED):
        scan.emit(Kind.DIAG_ENDED, line, proc)
        return
    found = VERDICT.match(body)
    if found:
        rank = FIRST_RANK.match(found["summary"])
        scan.emit(Kind.DIAG_VERDICT, line, proc, verdict=found["kind"], summary=found["summary"],
                  rank=int(rank.group(1)) if rank else None)


def verdict(entry, ctx) -> Finding:
    info = entry.first.info
    made = finding(entry, ctx, SEVERITY.get(VerdictKind(info["verdict"]), Severity.HANG),
                   summary=f"diag launch: [{info['verdict']}] {info['summary']}",
                   advice=VERDICT_ADVICE)
    made.process, made.rank = "diag launch", info["rank"]
    return made


def after_stop(stop, late: list, ctx, words: list[str]) -> Finding:
    """The errors the job printed after diag ended it, as one note."""
    count = sum(entry.count for entry in late)
    made = finding(late[0], ctx, Severity.NOTE, kind=Kind.AFTER_SHUTDOWN,
                   summary=f"{count} error{'s' if count > 1 else ''} after diag ended the job "
                           f"at line {stop.first.line}: " + "; ".join(words[:3]),
                   advice=STOPPED_ADVICE)
    made.count = count
    return made
