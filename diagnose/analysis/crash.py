"""A job that ended by itself after a rank failed crashed: it is no healthy run,
whatever the command's exit code (vLLM's server exits 0 after its engine died).
The first failure, an exception that left a rank's phase or a rank's death,
is named; launch/first_failure.py joins it with what the job's output says
(the one first failure of a report)."""
from __future__ import annotations

from dataclasses import replace

from diagnose.analysis.raised import ENDING_PHASES
from diagnose.analysis.timeline import at_stop, command_stop
from diagnose.analysis.view import DRIVER, find_deaths
from diagnose.analysis.wording import exit_text
from diagnose.core.snapshot import Crash, Snapshot


def crash_of(snapshot: Snapshot) -> Crash | None:
    """The first failure of a job that ended by itself; None while it runs, when
    diag stopped it, or when no rank failed."""
    if snapshot.command_exit is None or snapshot.stop is not None:
        return None
    return probed_failure(snapshot)


def probed_failure(snapshot: Snapshot) -> Crash | None:
    """The earliest failure the probes recorded, however the job ended: an
    exception that left a rank's phase (each rank keeps its first; one in
    dequeue, shutdown or exit is the engine being ended) or a rank's death; a
    death that a stop of the command's own caused is none."""
    stop = command_stop(snapshot)
    if stop is not None:
        snapshot = at_stop(replace(snapshot, stop=stop))
    found = []
    for rank, state in snapshot.ranks.items():
        error = state.error
        if error is not None and error.phase not in ENDING_PHASES:
            step = f" step {error.step}" if error.step is not None else ""
            frame = f" at {error.frame}" if error.frame else ""
            found.append(Crash(rank, error.at, f"{state.identity.name} raised {error.error} "
                                               f"in {error.phase}{step}{frame}"))
    for node, death in find_deaths(snapshot).items():
        if node == DRIVER:
            continue
        found.append(Crash(node, death.at, f"{snapshot.ranks[node].identity.name} died "
                                           f"({exit_text(death.exitcode)})"))
    return min(found, key=lambda crash: crash.at, default=None)
