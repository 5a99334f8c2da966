"""One culprit per root cause.

The rules run one after another, each over the same wait-for graph, so what
follows from a root cause can look like a cause of its own: a member that
agreed on a collective its peer got wrong goes on alone and seems to leave that
peer waiting; a rank that waits on a dead one looks stuck. A later verdict that
blames a rank an earlier one already explains (as its culprit, or as a process
waiting on it) is folded into that earlier verdict: its ranks become victims,
its sentence evidence of what followed.
"""
from __future__ import annotations

from diagnose.core.snapshot import Verdict
from diagnose.core.vocab import VerdictKind

CONSEQUENCES = "consequences"   # the evidence key of the folded sentences


def fold_consequences(verdicts: list[Verdict]) -> list[Verdict]:
    """`verdicts`, the most likely root cause first, with every consequence
    folded into the first verdict that explains it."""
    kept: list[Verdict] = []
    first: dict[int, int] = {}      # rank -> the first kept verdict that explains it
    for verdict in verdicts:
        at = _explaining(kept, first, verdict)
        if at is None:
            kept.append(verdict)
            _note(first, len(kept) - 1, verdict)
        else:
            _fold(kept[at], verdict)
            _note(first, at, kept[at])
    return kept


def _note(first: dict[int, int], at: int, cause: Verdict) -> None:
    for rank in cause.culprit_ranks + cause.victim_ranks:
        first.setdefault(rank, at)


def _explaining(kept: list[Verdict], first: dict[int, int], verdict: Verdict) -> int | None:
    """The index in `kept` of the first verdict that explains this one."""
    found = min((first[rank] for rank in verdict.culprit_ranks if rank in first), default=None)
    waiting = set(verdict.victim_ranks)
    if verdict.kind == VerdictKind.STATE_UNREADABLE and waiting:
        # its waiters wait on a culprit already named: nothing new
        for at, cause in enumerate(kept[:found]):
            if waiting <= set(cause.culprit_ranks) | set(cause.victim_ranks):
                return at
    return found


def _fold(cause: Verdict, consequence: Verdict) -> None:
    ranks = set(cause.victim_ranks) | set(consequence.victim_ranks)
    if consequence.kind != VerdictKind.STATE_UNREADABLE:   # of that rank nothing is known
        ranks |= set(consequence.culprit_ranks)
    cause.victim_ranks = sorted(ranks - set(cause.culprit_ranks))
    cause.evidence.setdefault(CONSEQUENCES, []).append(consequence.summary)
