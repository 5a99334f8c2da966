"""Calls a member went past without making: a collective, or its side of a send/recv."""
from __future__ import annotations

from collections import defaultdict

from diagnose.analysis.graph import reachers, waited_by
from diagnose.analysis.position import current_step, phase_name, position
from diagnose.analysis.thresholds import StallLimits
from diagnose.analysis.view import Node, View
from diagnose.analysis.wording import (Words, at_frame, doing, rank_evidence, rank_list, ranks_of,
                                       verb, who)
from diagnose.core.snapshot import CollectiveRecord, Verdict
from diagnose.core.vocab import P2P_OPS, Op, VerdictKind, paired_op


def skipped_collective_verdicts(view: View, graph: dict[Node, set[Node]],
                                limits: StallLimits) -> list[Verdict]:
    """A member that has gone on past (G, S) without joining it, while others wait
    in it: it skipped the collective, whatever cycle the graph shows."""
    verdicts, named, reverse = [], set(), None
    waiting: dict[tuple[str, int], list[int]] = defaultdict(list)
    for rank, record in view.pending.items():
        if record.op not in P2P_OPS and rank not in view.deaths:
            waiting[(record.group, record.seq)].append(rank)
    for (group, seq), waiters in sorted(waiting.items()):
        since = min(view.pending[rank].t_enqueue for rank in waiters)
        stall = view.now - since
        if stall < max(limits.limit(phase_name(view.ranks[rank])) for rank in waiters):
            continue
        for member in view.groups.get(group, []):
            if member in named or not _went_past(view, member, group, seq, waiters):
                continue
            named.add(member)
            state = view.ranks[member]
            if reverse is None:
                reverse = waited_by(graph)
            victims = reachers(reverse, {member})
            op = view.pending[waiters[0]].op
            words = Words().culprit(who(view, member)).add(
                f" never joined {group} {op} seq {seq} that {rank_list(sorted(waiters))} "
                f"{verb(waiters)} in for {stall:.0f} s: it went on to {doing(state)}"
                f"{at_frame(state)}").waiting(victims, exclude=set(waiters))
            verdicts.append(_skipped_verdict(view, member, victims, words, group, seq,
                                             stall, waiters))
    return verdicts


def _skipped_verdict(view: View, member: int, victims: set[Node], words: Words, group: str,
                     seq: int, stall: float, waiters: list[int]) -> Verdict:
    state = view.ranks[member]
    return Verdict(kind=VerdictKind.COLLECTIVE_MISSING_PEERS, culprit_ranks=[member],
                   victim_ranks=ranks_of(victims), summary=words.text, spans=words.spans,
                   phase=phase_name(state),
                   step=current_step(state), group=group, seq=seq,
                   detected_after_s=round(stall, 3),
                   evidence=rank_evidence(view, state) | {"waiting_ranks": sorted(waiters)})


def skipped_p2p_verdicts(view: View, graph: dict[Node, set[Node]], limits: StallLimits,
                         found: list[Verdict]) -> list[Verdict]:
    """A peer that went on past its side of a send/recv a rank waits in: it skipped
    the call (a stage that never sent), whatever cycle through the driver the
    graph shows."""
    verdicts, named = [], {rank for verdict in found for rank in verdict.culprit_ranks}
    for rank, record in sorted(view.pending.items()):
        if record.op not in P2P_OPS or rank in view.deaths or record.peer in named:
            continue
        stall = view.now - record.t_enqueue
        if stall < limits.limit(phase_name(view.ranks[rank])):
            continue
        peer, other = record.peer, paired_op(record.op)
        if not _went_past_p2p(view, peer, other, rank, record):
            continue
        named.add(peer)
        state = view.ranks[peer]
        victims = reachers(waited_by(graph), {peer})
        arrow = f"->{rank}" if other == Op.SEND else f"<-{rank}"
        words = Words().culprit(who(view, peer)).add(
            f" never made its {record.group} {other}{arrow} #{record.seq} that rank {rank} "
            f"waits in for {stall:.0f} s: it went on to {doing(state)}{at_frame(state)}"
        ).waiting(victims, exclude={rank})
        verdicts.append(_skipped_verdict(view, peer, victims, words, record.group,
                                         record.seq, stall, [rank]))
    return verdicts


def _went_past_p2p(view: View, peer: int, op: str, rank: int, record: CollectiveRecord) -> bool:
    if peer in view.deaths or peer not in view.ranks:
        return False
    if view.highest_seq.get((record.group, op, peer, rank), -1) >= record.seq:
        return False
    pending = view.pending.get(peer)
    if pending is not None and pending.op in P2P_OPS and pending.peer == rank:
        return False
    ahead, behind = position(view.ranks[peer]), position(view.ranks[rank])
    return ahead is not None and behind is not None and ahead[0] > behind[0]  # left the step


def _went_past(view: View, member: int, group: str, seq: int, waiters: list[int]) -> bool:
    if member in view.deaths or member not in view.ranks or view.has_joined(member, group, seq):
        return False
    pending = view.pending.get(member)
    if pending is not None and pending.group == group:
        return False
    ahead = position(view.ranks[member])
    if ahead is None:
        return False
    for rank in waiters:
        behind = position(view.ranks[rank])
        if behind is None or ahead <= behind:
            return False
    return True
