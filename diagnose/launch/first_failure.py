"""The job's first failure, one for the report and diag's last lines. Two
witnesses see failures: the probes (error-R.json, each rank's first exception
with its time; a rank's death) and the job's output, as `diag logs` reads it
(the process, the exception, the innermost frame of the program's own code;
one raised in hangscope's probe says so first). The probes' earliest record
is the first failure wherever there is one: it has a time, and a later error
(vLLM's shutdown cancels every rank's dequeue) never replaces it; the output
adds where it printed it. The output alone names the failure of a process
without a probe, or of one that failed before its probe began."""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

from diagnose.analysis.crash import probed_failure
from diagnose.core.output import OUTPUT_LOG
from diagnose.core.snapshot import Crash, Snapshot, Verdict
from diagnose.offline.logs import Severity, scan_files


@dataclass
class FirstFailure:
    summary: str
    rank: int | None
    at: float | None            # when the probe recorded it; None: from the output only
    process: str                # as the output names it; "" where it did not print it
    line: int | None            # of output.log; None where it did not print it
    source: str                 # "probe" or "output"


def wanted(snapshot: Snapshot | None, verdicts: list[Verdict], crash: Crash | None) -> bool:
    """A verdict (a hang may follow a crash: vLLM's workers wait in their exit
    for an engine core that died), a crash, or a command that failed."""
    failed = snapshot is not None and snapshot.command_exit not in (0, None)
    return failed or bool(verdicts) or crash is not None


def first_failure(run_dir: str, snapshot: Snapshot | None) -> FirstFailure | None:
    probed = probed_failure(snapshot) if snapshot is not None else None
    logged = [finding for finding in scan_files([os.path.join(run_dir, OUTPUT_LOG)]).findings
              if finding.severity == Severity.FAILURE]
    if probed is None:
        return next((FirstFailure(f.summary, f.rank, None, f.process, f.line, "output")
                     for f in logged), None)
    printed = next((f for f in logged if f.rank == probed.rank), None)
    if printed is None:
        return FirstFailure(probed.summary, probed.rank, probed.at, "", None, "probe")
    error = snapshot.ranks[probed.rank].error
    raised = error is not None and error.at == probed.at
    # an exception the probe caught says its phase and step; of a death, the
    # output tells more than "died (exit code 1)": the exception that ended it
    summary = probed.summary if raised else printed.summary
    return FirstFailure(summary, probed.rank, probed.at, printed.process, printed.line, "probe")


def line(found: FirstFailure) -> str:
    """The line diag says, its text made safe for a terminal."""
    text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in found.summary)
    where = (f"from its output (line {found.line})" if found.source == "output"
             else f"recorded by its probe{f', output line {found.line}' if found.line else ''}")
    return f"the job's first failure, {where}: {text}"


def worded(crash: Crash | None, found: FirstFailure | None) -> Crash | None:
    """The crash as the first failure words it: one wording in the report."""
    if crash is None or found is None:
        return crash
    return replace(crash, summary=found.summary)
