"""A GPU that stopped in a step's own work, with no collective to show it.

The probe marks, on a CUDA device, the end of each step phase's work with an
event as the host leaves the phase, and the heartbeat thread publishes the
oldest such work the GPU has not finished (RankState.device_pending). A rank
whose host left a phase longer ago than the stall limit, while its GPU is
still short of that phase's end, is `gpu_stuck`: at tp=1 the host then sits
in the next host sync (sample) and looks stuck there, but waits on its GPU.

A rank waiting in a traced collective is left to the wait-for graph: its GPU
may wait on a peer's (roots.py names the GPU that did not reach the call).
"""
from __future__ import annotations

from dataclasses import asdict

from diagnose.analysis.graph import reachers, waited_by
from diagnose.analysis.position import current_step, limit_phase, phase_name, where
from diagnose.analysis.thresholds import StallLimits
from diagnose.analysis.view import Node, View
from diagnose.analysis.wording import Words, at_frame, rank_evidence, ranks_of, step_text, who
from diagnose.core.snapshot import Verdict
from diagnose.core.vocab import VerdictKind


def gpu_work_verdicts(view: View, graph: dict[Node, set[Node]], limits: StallLimits,
                      named: set[int]) -> list[Verdict]:
    verdicts, reverse = [], None
    for rank, state in view.ranks.items():
        work = state.device_pending
        if work is None or rank in named or rank in view.deaths:
            continue
        if state.progress_at is not None:
            continue                # its agent holds its rings back: the phase it is in is unknown
        record = view.pending.get(rank)
        if record is not None and record.device:
            continue
        stall = view.now - work.host_left_at
        if stall < limits.limit(limit_phase(view, rank)):
            continue
        if reverse is None:
            reverse = waited_by(graph)
        victims = reachers(reverse, {rank})
        step = "" if work.step is None else f" at step {work.step}"
        host = f"{where(state).removeprefix('stuck ')}{step_text(state)}{at_frame(state)}"
        words = Words().culprit(who(view, rank)).add(
            f": the GPU has not finished the work of {work.phase}{step}, which the host left "
            f"{stall:.0f} s ago; the host is {host}").waiting(victims)
        evidence = rank_evidence(view, state) | {"device": {
            "not_finished": asdict(work), "last_finished_at": state.device_done_at,
            "host": host}}
        verdicts.append(Verdict(
            kind=VerdictKind.GPU_STUCK, culprit_ranks=[rank], victim_ranks=ranks_of(victims),
            summary=words.text, spans=words.spans, phase=phase_name(state),
            step=current_step(state), detected_after_s=round(stall, 3), evidence=evidence))
    return verdicts
