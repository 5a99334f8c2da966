"""Ranks that make progress, but far slower than their peers."""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from operator import attrgetter
from statistics import median

from diagnose.analysis.position import current_step, phase_name
from diagnose.analysis.thresholds import Thresholds
from diagnose.analysis.view import View
from diagnose.analysis.wording import Words, rank_list, who
from diagnose.core.layout import tp_group_name
from diagnose.core.snapshot import RankState, Verdict
from diagnose.core.vocab import Phase, VerdictKind

ENQUEUED_AT = attrgetter("t_enqueue")
STARTED_AT = attrgetter("start")


def straggler_verdicts(view: View, thresholds: Thresholds) -> list[Verdict]:
    """A rank whose own work per step (time in execute_model not spent waiting in a
    collective) is consistently far above its peers'. TP peers do the same work;
    without TP every other rank is a peer."""
    own = {rank: _own_step_times(state) for rank, state in view.ranks.items()
           if rank not in view.deaths}
    verdicts = []
    for rank, steps in own.items():
        if len(steps) < thresholds.straggler_min_steps:
            continue                    # too few steps of its own to be common with peers'
        peers = _step_peers(view, rank)
        theirs_by_peer = [own[peer] for peer in peers if peer in own]
        peer_steps = set().union(*theirs_by_peer)
        common = [step for step in steps if step in peer_steps]
        if len(common) < thresholds.straggler_min_steps:
            continue
        mine = median([steps[step] for step in common])
        theirs = median([times[step] for step in common for times in theirs_by_peer
                         if step in times])
        if mine < thresholds.straggler_ratio * theirs or mine - theirs < thresholds.straggler_margin_s:
            continue
        peers_waiting = sorted(peer for peer in peers if peer in own)
        words = Words().culprit(who(view, rank)).add(
            f" is a straggler: its own work takes {mine:.2f} s a step against {theirs:.2f} s "
            f"on {rank_list(peers_waiting)} (median of {len(common)} steps); it makes "
            f"progress, not a hang")
        verdicts.append(Verdict(
            kind=VerdictKind.STRAGGLER, culprit_ranks=[rank], victim_ranks=peers_waiting,
            summary=words.text, spans=words.spans,
            phase=phase_name(view.ranks[rank]), step=current_step(view.ranks[rank]),
            evidence={"own_step_s": {str(step): round(steps[step], 4) for step in common},
                      "peer_median_s": round(theirs, 4)}))
    return verdicts


def _own_step_times(state: RankState) -> dict[int, float]:
    """Step -> seconds of the rank's own work: from the end of the dequeue that
    gave it the step to the end of execute_model, less the time spent waiting in
    collectives. Only steps that the rank's record ring fully covers count."""
    steps = sorted((event for event in state.phases if event.name == Phase.EXECUTE_MODEL
                    and event.end is not None and event.step is not None),
                   key=STARTED_AT)
    if not steps:
        return {}
    covered_from = min(map(ENQUEUED_AT, state.collectives), default=None)
    dequeued = sorted(event.end for event in state.phases
                      if event.name == Phase.DEQUEUE and event.end is not None)
    # Completed calls by enqueue time (a stable sort, and nearly always sorted
    # already), so each step's calls are one slice found by bisection.
    calls = sorted([record for record in state.collectives if record.t_complete is not None],
                   key=ENQUEUED_AT)
    enqueued = list(map(ENQUEUED_AT, calls))
    times, previous_end = {}, None
    for event in steps:
        start = event.start
        last = bisect_right(dequeued, event.start) - 1   # the last dequeue ended by then
        if last >= 0 and (previous_end is None or dequeued[last] >= previous_end):
            start = dequeued[last]
        previous_end = event.end
        if covered_from is not None and start < covered_from:
            continue
        waited = sum(record.t_complete - record.t_enqueue for record in
                     calls[bisect_left(enqueued, start):bisect_right(enqueued, event.end)])
        times[event.step] = max(0.0, event.end - start - waited)
    return times


def _step_peers(view: View, rank: int) -> list[int]:
    ident = view.ranks[rank].identity
    if ident.tp_size and ident.tp_size > 1 and ident.pp_rank is not None:
        group = view.groups.get(tp_group_name(ident.pp_rank), [])
        return [peer for peer in group if peer != rank]
    return [peer for peer in view.ranks if peer != rank]
