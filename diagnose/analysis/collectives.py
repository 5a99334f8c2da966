"""Collectives the members disagree on, and calls a member went past without making."""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import asdict

from diagnose.analysis.graph import reachers, waited_by
from diagnose.analysis.position import current_step, phase_name, position
from diagnose.analysis.thresholds import StallLimits
from diagnose.analysis.view import P2P_OPS, Node, View
from diagnose.analysis.wording import (Words, at_frame, doing, rank_evidence, rank_list, ranks_of,
                                       verb, who)
from diagnose.core.snapshot import CollectiveRecord, Verdict
from diagnose.core.vocab import VerdictKind


def mismatch_verdicts(view: View) -> list[Verdict]:
    """Members at the same seq of a group that call different ops, shapes or dtypes:
    the first such seq of each group; the minority are the culprits."""
    verdicts, reported = [], set()
    disagreeing = [key for key in view.joined if key in view.disagreeing]
    for group, seq in sorted(disagreeing, key=lambda key: key[1]):
        records = view.joined[(group, seq)]
        if group in reported or len(records) < 2:
            continue
        signatures = {rank: signature(record) for rank, record in records.items()}
        counts = Counter(signatures.values())
        if len(counts) < 2:
            continue
        reported.add(group)
        top = counts.most_common()
        majority = top[0][0] if top[0][1] > top[1][1] else None
        due = None
        if majority is None:  # a tie (two ranks, say): the call the group's history expects wins
            due = _expected_signature(view, group, seq, set(counts))
            majority = due
        culprits = sorted(rank for rank, sig in signatures.items() if sig != majority)
        victims = sorted(rank for rank, sig in signatures.items() if sig == majority)
        calls = "; ".join(f"{rank_list(r for r, s in signatures.items() if s == sig)}: "
                          f"{describe_call(sig)}" for sig, _ in top)
        words = Words(f"{group} seq {seq}: members disagree on the collective: {calls}")
        if due:
            words.add(f"; {describe_call(majority)} was due (the group made it before), so ")
            words.culprit(rank_list(culprits)).add(_departure(majority, signatures[culprits[0]]))
        verdicts.append(Verdict(
            kind=VerdictKind.COLLECTIVE_MISMATCH, culprit_ranks=culprits, victim_ranks=victims,
            summary=words.text, spans=words.spans,
            group=group, seq=seq, step=current_step(view.ranks[culprits[0]]),
            evidence={"calls": {str(rank): asdict(record) for rank, record in records.items()}}))
    return verdicts


def _departure(due: tuple, made: tuple) -> str:
    if due[0] == made[0]:
        return " made it with other sizes or dtypes"
    return " skipped or added a call"


def _expected_signature(view: View, group: str, seq: int, tied: set[tuple]) -> tuple | None:
    """Which of the `tied` calls the group's history says call `seq` should be,
    among the calls every member agreed on before it. Engine steps repeat the
    same calls: first the call one period back (the period is the shortest that
    fits the recent history); else the one call of `tied` the group has made
    before, where only one has."""
    agreed = {}
    for (name, number), records in view.joined.items():
        signatures = {signature(record) for record in records.values()}
        if name == group and number < seq and len(records) > 1 and len(signatures) == 1:
            agreed[number] = signatures.pop()
    numbers = sorted(agreed, reverse=True)
    for period in range(1, len(numbers) // 2 + 1):
        recent = numbers[:2 * period]
        if all(agreed.get(n - period, agreed[n]) == agreed[n] for n in recent):
            due = agreed.get(seq - period)
            return due if due in tied else None
    familiar = tied & set(agreed.values())
    return familiar.pop() if len(familiar) == 1 else None


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
        peer, other = record.peer, "recv" if record.op == "send" else "send"
        if not _went_past_p2p(view, peer, other, rank, record):
            continue
        named.add(peer)
        state = view.ranks[peer]
        victims = reachers(waited_by(graph), {peer})
        arrow = f"->{rank}" if other == "send" else f"<-{rank}"
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


def signature(record: CollectiveRecord) -> tuple:
    return (record.op, tuple(tuple(shape) for shape in record.shapes), record.dtype)


def describe_call(signature: tuple) -> str:
    op, shapes, dtype = signature
    return f"{op} {[list(shape) for shape in shapes]} {dtype}"
