"""What killed the job, as `diag logs` reads it from the job's output: when the
run has a verdict or the command failed, the report names the first
failure (the process, the exception and the innermost frame of the program's
own code; one raised in hangscope's probe says so first), not only that a
process died."""
from __future__ import annotations

import os

from diagnose.core.output import OUTPUT_LOG
from diagnose.core.snapshot import Snapshot, Verdict
from diagnose.offline.logs import Severity, scan_files


def wanted(snapshot: Snapshot | None, verdicts: list[Verdict]) -> bool:
    """A verdict (a hang may follow a crash: vLLM's workers wait in their exit
    for an engine core that died), or the command ended with a failure."""
    failed = snapshot is not None and snapshot.command_exit not in (0, None)
    return failed or bool(verdicts)


def first_failure(run_dir: str) -> dict | None:
    """The first failure in the job's output: summary, process, rank and the
    output line; None if the output shows none."""
    report = scan_files([os.path.join(run_dir, OUTPUT_LOG)])
    for finding in report.findings:
        if finding.severity == Severity.FAILURE:
            return {"summary": finding.summary, "process": finding.process,
                    "rank": finding.rank, "line": finding.line}
    return None


def line(found: dict) -> str:
    """The line diag says, its text from the job's output made safe for a terminal."""
    text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in found["summary"])
    return f"the job's first failure, from its output (line {found['line']}): {text}"
