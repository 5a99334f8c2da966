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
    for verdict in verdicts:
        cause = _explaining(kept, verdict)
        if cause is None:
            kept.append(verdict)
        else:
            _fold(cause, verdict)
    return kept


def _explaining(kept: list[Verdict], verdict: Verdict) -> Verdict | None:
    blamed, waiting = set(verdict.culprit_ranks), set(verdict.victim_ranks)
    for cause in kept:
        explained = set(cause.culprit_ranks) | set(cause.victim_ranks)
        if blamed & explained:
            return cause
        if verdict.kind == VerdictKind.STATE_UNREADABLE and waiting and waiting <= explained:
            return cause    # its waiters wait on a culprit already named: nothing new
    return None


def _fold(cause: Verdict, consequence: Verdict) -> None:
    ranks = set(cause.victim_ranks) | set(consequence.victim_ranks)
    if consequence.kind != VerdictKind.STATE_UNREADABLE:   # of that rank nothing is known
        ranks |= set(consequence.culprit_ranks)
    cause.victim_ranks = sorted(ranks - set(cause.culprit_ranks))
    cause.evidence.setdefault(CONSEQUENCES, []).append(consequence.summary)
