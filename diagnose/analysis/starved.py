"""How long a stalled process, and the job around it, waited for a CPU, from the
run-delay samples the collector took (RankState.cpu_waits), and how long diag's
own native stack dumps held it stopped (Snapshot.paused); the evidence."""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import asdict

from diagnose.analysis.doing import tied_peers, waits_on_peers
from diagnose.analysis.thresholds import StallLimits
from diagnose.analysis.view import Node, View
from diagnose.core.snapshot import CpuWait, RankState, Snapshot, Verdict

SHOWN_WAIT_S = 0.1        # less than this in the evidence would say nothing


def cpu_waited(state: RankState, since: float, until: float) -> float:
    """Seconds the process's threads waited for a CPU between `since` and `until`:
    the samples' totals, linear between two samples; the time outside the
    samples counts nothing (a wait not seen is no excuse for a stall)."""
    samples = state.cpu_waits
    if len(samples) < 2 or until <= since:
        return 0.0
    return max(0.0, _total_at(samples, until) - _total_at(samples, since))


def job_waited(view: View, since: float, until: float) -> float:
    """How long the job's processes waited for a CPU, in all, between `since`
    and `until`. A stalled rank may wait on starved processes the wait-for
    graph does not show, one after another: a peer whose transport thread has
    not yet written what the rank's collective needs, the peer before it; so
    the waits add up (where they overlap, the bound on the stretch caps them)."""
    sampled = view.memo("cpu sampled", lambda: [
        state for state in [*view.ranks.values(), view.driver]
        if state is not None and len(state.cpu_waits) > 1])
    return sum(cpu_waited(state, since, until) for state in sampled)


def excused(view: View, node: Node, since: float, until: float) -> float:
    """Seconds of a stall of `node` between `since` and `until` that were not its
    own doing: the job's waits for a CPU, and the time diag itself held it, or
    a TP peer tied with it in its step and not known to wait (doing.tied_peers:
    the peer may be what it waits on), stopped for a native stack dump. A dump
    of any other rank excuses nothing: the dumps of a job's many ranks would
    add up to the bound of every stretch."""
    held = {node, *(peer for peer in tied_peers(view, node)
                     if not waits_on_peers(view.ranks[peer]))}
    spans = sorted((max(since, pause.start), min(until, view.now if pause.end is None
                                                   else pause.end))
                   for pause in view.snapshot.paused if pause.rank in held)
    return job_waited(view, since, until) + _covered(spans)


def _covered(spans: list[tuple[float, float]]) -> float:
    """The length of the union of sorted (start, end) spans."""
    total, reach = 0.0, float("-inf")
    for start, end in spans:
        start = max(start, reach)
        if end > start:
            total += end - start
            reach = end
    return total


def _total_at(samples: list[CpuWait], when: float) -> float:
    if when <= samples[0].at:
        return samples[0].waited_s
    if when >= samples[-1].at:
        return samples[-1].waited_s
    after = bisect_left([sample.at for sample in samples], when)
    a, b = samples[after - 1], samples[after]
    return a.waited_s + (b.waited_s - a.waited_s) * (when - a.at) / (b.at - a.at)


def wait_evidence(limits: StallLimits, limit: float, waited: dict) -> dict:
    """{"cpu_wait": {process: its wait and the limit it stretched}} for the
    processes that waited for a CPU while they stalled; {} if none did."""
    shown = {str(node): {"cpu_waited_s": round(seconds, 3), "limit_s": round(limit, 3),
                         "stretched_limit_s": round(limits.stretched(limit, seconds), 3)}
             for node, seconds in sorted(waited.items(), key=lambda item: str(item[0]))
             if seconds >= SHOWN_WAIT_S}
    return {"cpu_wait": shown} if shown else {}


def with_host(verdicts: list[Verdict], snapshot: Snapshot) -> list[Verdict]:
    """Each verdict's evidence says how loaded the judging host was."""
    if snapshot.host is not None:
        for verdict in verdicts:
            verdict.evidence["host"] = asdict(snapshot.host)
    return verdicts
