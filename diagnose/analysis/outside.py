"""Ranks known only by their stacks (RankState.only_stacks): no phase or collective
was recorded for them, only what diag saw from outside, as diag attach samples a
job started without diag. Where no position says what a rank waits on, what it
is doing does: a rank still waiting in a collective (or on its GPU) through
every sample waits on the members of its groups seen still doing something of
their own, running its code or blocked outside the job. A rank idle, waiting
for work, or compiling, is no reason for a peer to wait. The roots of the
wait-for graph are then judged as any other's (roots.py), their stall being
how long their stack has not moved."""
from __future__ import annotations

from diagnose.analysis.doing import activity, waits_on_peers
from diagnose.analysis.view import Node, View
from diagnose.core.snapshot import RankState
from diagnose.core.vocab import Activity

OWN_WORK = frozenset({Activity.RUNNING, Activity.SLEEPING})
DOING = {Activity.RUNNING: "running its own code",
         Activity.SLEEPING: "sleeping or blocked outside the job"}


def stack_waits(view: View, rank: int, state: RankState) -> set[Node]:
    """The members of the rank's groups it waits on, read from what each does."""
    if not (waits_on_peers(state) and still(state)):
        return set()
    members = {member for group in view.groups.values() if rank in group for member in group}
    return {member for member in members - {rank}
            if member in view.ranks and member not in view.deaths
            and _held_by_own_work(view.ranks[member])}


def _held_by_own_work(state: RankState) -> bool:
    return state.only_stacks and activity(state) in OWN_WORK and still(state)


def still(state: RankState) -> bool:
    """Its stack did not move from the first sample (its started_at) to the last."""
    return state.frame_moved_at is not None and state.frame_moved_at <= state.started_at


def stack_text(state: RankState, stall: float) -> str:
    """'is running its own code at X, its stack unchanged for 5 s'."""
    found = activity(state)
    doing = DOING.get(found, str(found) if found else "doing what its stack shows")
    sample = state.activity
    how = f" ({sample.frame})" if sample and sample.frame and sample.frame != state.frame else ""
    where = f" at {state.frame}" if state.frame else ""
    return f"is {doing}{how}{where}, its stack unchanged for {stall:.0f} s"
