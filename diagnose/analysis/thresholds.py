"""How long a rank may sit without progress before the analysis calls it stuck.

`auto` (the default) learns a limit per phase from the durations the snapshot's
phase history shows: a phase may take `factor` times the longest finished
instance of it, never less than a floor. Start-up phases (and a step phase no
one has finished yet, such as a slow first step) get a far higher floor than a
steady-state step. An explicit number gives every phase that limit.

Stall time is measured from a rank's last progress (a phase boundary or a
collective event), so a long prefill that keeps completing collectives is not
stalled however long its step takes.

A process that waited for a CPU while it stalled (a starved host: its threads
runnable but not run) gets that time on top of its limit, up to `cpu_stretch`
times the limit (`stretched`): a healthy rank that waits for a core is no
hang, and a real hang on a loaded host is still named, at most that much later.
"""
from __future__ import annotations

from dataclasses import dataclass

from diagnose.core.snapshot import Snapshot
from diagnose.core.vocab import STARTUP_PHASES


class ThresholdError(ValueError):
    """A --stall-timeout value that is neither 'auto' nor a positive number."""


@dataclass(frozen=True)
class Thresholds:
    stall_s: float | None = None   # explicit limit for every phase; None = auto
    floor_s: float = 2.0           # steady state: a hang is named within a few seconds
    startup_s: float = 20.0        # start-up phases and phases with no finished instance
    factor: float = 4.0            # a phase may take this many times its longest finished run
    compile_s: float = 600.0       # a rank may compile this long before it is a verdict
    cpu_stretch: float = 10.0      # time waited for a CPU stretches a limit up to this many
                                   # times; 1 turns the stretch off

    # Straggler: a rank's own work per step against its peers'.
    straggler_ratio: float = 3.0
    straggler_margin_s: float = 0.5
    straggler_min_steps: int = 3

    @classmethod
    def parse(cls, text: str) -> Thresholds:
        if text == "auto":
            return cls()
        try:
            seconds = float(text)
        except ValueError:
            seconds = -1.0
        if not seconds >= 0 or seconds == float("inf"):
            raise ThresholdError(f"--stall-timeout must be 'auto' or seconds >= 0, not {text!r}")
        return cls(stall_s=seconds)


class StallLimits:
    """The limit, in seconds, for each phase of one snapshot."""

    def __init__(self, snapshot: Snapshot, thresholds: Thresholds):
        self.thresholds = thresholds
        self.longest = _longest_warm_durations(snapshot)

    def limit(self, phase: str | None) -> float:
        t = self.thresholds
        if t.stall_s is not None:
            return t.stall_s
        if phase is None:
            return t.floor_s
        longest = self.longest.get(phase)
        if phase in STARTUP_PHASES or longest is None:
            return max(t.startup_s, t.factor * (longest or 0.0))
        return max(t.floor_s, t.factor * longest)


    def stretched(self, limit: float, cpu_waited_s: float) -> float:
        """The limit for a process that waited `cpu_waited_s` for a CPU while it
        stalled: limit + waited, at most cpu_stretch x limit."""
        return limit + min(cpu_waited_s, (self.thresholds.cpu_stretch - 1.0) * limit)


def _longest_warm_durations(snapshot: Snapshot) -> dict[str, float]:
    """Longest finished duration of each phase, leaving out each process's first
    instance of a phase that repeats (a cold first step says nothing about the next)."""
    longest: dict[str, float] = {}
    processes = list(snapshot.ranks.values())
    if snapshot.driver is not None:
        processes.append(snapshot.driver)
    for state in processes:
        for name, took in _warm_durations(state.phases).items():
            longest[name] = max(longest.get(name, 0.0), took)
    return longest


def _warm_durations(phases) -> dict[str, float]:
    """One process's longest duration of each finished phase, its first instance
    (the earliest started; of equal starts, the first listed) left out where the
    phase repeats, except for start-up phases. One pass, no sort: this runs for
    every rank at every judgment."""
    first: dict[str, tuple[float, float]] = {}   # name -> (start, duration) of its first
    later: dict[str, float] = {}                 # name -> the longest of the others
    for event in phases:
        if event.end is None:
            continue
        name, start, took = event.name, event.start, event.end - event.start
        earliest = first.get(name)
        if earliest is None:
            first[name] = (start, took)
            continue
        if start < earliest[0]:
            first[name], (start, took) = (start, took), earliest
        best = later.get(name)
        if best is None or took > best:
            later[name] = took
    return {name: (max(took, later.get(name, took)) if name in STARTUP_PHASES
                   else later.get(name, took))
            for name, (_, took) in first.items()}
