"""What each rank is, as the verdicts see it: the culprit, a victim, dead, or
running, exited or ended. The report's rank table and the TUI show it; they
judge nothing themselves."""
from __future__ import annotations

from typing import Callable

from diagnose.core.snapshot import RankState, Verdict
from diagnose.core.vocab import RankStatus, VerdictKind


def rank_status(verdicts: list[Verdict]) -> Callable[[int, RankState], RankStatus]:
    """A rank's status under these verdicts. A process that is gone is dead only
    where a death verdict names it; a job judged as it stood before its processes
    ended (a post-mortem, a stopped hang, a synth dir) has ranks that wait, with
    an old heartbeat, and ranks that ended: normally (exited), or otherwise with
    no death to blame (ended)."""
    culprits = {rank for verdict in verdicts for rank in verdict.culprit_ranks}
    victims = {rank for verdict in verdicts for rank in verdict.victim_ranks}
    deaths = [verdict for verdict in verdicts if verdict.kind == VerdictKind.DEAD]
    first_dead = {rank for verdict in deaths for rank in verdict.culprit_ranks}
    died = {rank for verdict in deaths for rank in verdict.victim_ranks}

    def status(rank: int, state: RankState) -> RankStatus:
        if rank in first_dead:      # dead, even while its file still says alive
            return RankStatus.DEAD
        if rank in culprits:
            return RankStatus.CULPRIT
        if not state.alive and rank in died:
            return RankStatus.DEAD
        if rank in victims:
            return RankStatus.VICTIM
        if state.alive:
            return RankStatus.RUNNING
        return RankStatus.EXITED if state.ended_normally else RankStatus.ENDED
    return status
