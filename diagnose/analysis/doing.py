"""What each rank is doing now, as far as the analysis trusts its last sample.

A sample (RankState.activity, taken from outside by diag launch) tells what the
rank did when it was taken; it still holds only if the rank has made no
progress since. A rank without such a sample is judged by its position alone.
"""
from __future__ import annotations

from diagnose.analysis.position import innermost, last_progress, open_step, tp_peers
from diagnose.analysis.view import Node, View
from diagnose.core.snapshot import RankState
from diagnose.core.vocab import STARTUP_PHASES, Activity

# The states in which a rank waits on its peers (or on device work they share).
WAITING = frozenset({Activity.COLLECTIVE, Activity.GPU_WAIT})
SAMPLE_WAIT_S = 10.0   # how long a tie that samples can break waits for them
BUSY_WAIT_S = 15.0     # diag launch samples a busy rank again after 2 s; a dump may take 10 s


def activity(state: RankState) -> Activity | None:
    """The rank's activity now, or None where no sample can be trusted: none was
    taken, it is of another process, it found no stack, or the rank moved since."""
    if not sampled(state):
        return None
    found = Activity(state.activity.activity)
    return None if found == Activity.UNKNOWN else found


def sampled(state: RankState) -> bool:
    """A sample of this process was taken since its last progress (it may still
    have found no stack: ptrace refused)."""
    sample = state.activity
    return (sample is not None and state.alive and sample.pid == state.identity.pid
            and sample.taken_at >= last_progress(state))


def settled(state: RankState) -> bool:
    """Its last sample is all a tie will learn of it: it read what the rank does,
    or ptrace was refused, so that no later sample will read more."""
    return sampled(state) and (activity(state) is not None or state.activity.denied)


def waits_on_peers(state: RankState) -> bool:
    return activity(state) in WAITING


def not_waiting(state: RankState) -> bool:
    """Known to do something of its own: run, sleep, compile, or wait for work, or
    use CPU where its stack could not be read."""
    found = activity(state)
    return (found is not None and found not in WAITING) or busy_unread(state)


def busy_unread(state: RankState) -> bool:
    """Its last sample read no stack (py-spy failed on a rank busy compiling), yet
    the rank used CPU: at work of its own, since a wait in a collective blocks."""
    return sampled(state) and state.activity.busy and activity(state) is None


def compiling_s(state: RankState, now: float) -> float | None:
    """How long the rank has been compiling, while it still is; None if it is not."""
    sample = state.activity
    if activity(state) != Activity.COMPILING or sample.compiling_since is None:
        return None
    return max(0.0, now - sample.compiling_since)


def sample_wait(view: View, node: Node) -> float:
    """Seconds more a worker's stall must last before it is named, while diag
    launch samples states: a worker inside step N with nothing pending, beside a
    TP peer in the same place, is a tie that only what they are doing breaks
    (who waits in the collective, who does not); until both have a sample to
    trust (settled: a dump that failed once, on a rank compiling, says nothing
    yet), naming either is a guess. A rank last found busy with no stack read
    (progress, see last_progress) waits for the next sample to say whether it
    still is. Without sampling, positions decide at once."""
    state = view.ranks.get(node) if isinstance(node, int) else None
    if not view.snapshot.sampling or state is None:
        return 0.0
    if busy_unread(state):
        return BUSY_WAIT_S
    if node in view.pending:
        return 0.0
    tied = tied_peers(view, node)
    if not tied or all(settled(view.ranks[rank]) for rank in tied + [node]):
        return 0.0
    return SAMPLE_WAIT_S


def tied_peers(view: View, node: Node) -> list[int]:
    """The TP peers of a worker with nothing pending that stand in its step with
    nothing pending either: by positions, none of them waits on another."""
    state = view.ranks.get(node) if isinstance(node, int) else None
    step = None if state is None or node in view.pending else open_step(state)
    if step is None:
        return []
    return [peer for peer in tp_peers(view, node) if peer not in view.pending
            and open_step(view.ranks[peer]) == step]


def absent_ranks(view: View) -> set[int]:
    """Ranks of the world that have not shown up at all (no probe file yet, none
    unreadable): a rank seen waiting in a collective may wait on one of them, at
    a rendezvous while a slow peer still starts."""
    sizes = [state.identity.world_size for state in view.ranks.values()
             if state.identity.world_size]
    return set(range(max(sizes, default=0))) - set(view.ranks) - set(view.unreadable)


def own_work(state: RankState) -> bool:
    """Seen doing something of its own, not blocked on a peer: sleeping, compiling,
    or using CPU outside a wait (a busy sample that read no stack counts too)."""
    found = activity(state)
    if found in (Activity.SLEEPING, Activity.COMPILING):
        return True
    return sampled(state) and state.activity.busy and found not in WAITING


def waits_for_absent(view: View, state: RankState) -> bool:
    """Ranks of its world have not shown up yet, and this rank is seen waiting in
    a collective, or is in a start-up phase without being seen at work of its own: at
    init_distributed's rendezvous it waits on them whatever else its sample says
    (a Python-only dump reads gloo's C++ wait as running; a failed one, nothing)."""
    if not absent_ranks(view):
        return False
    if waits_on_peers(state):
        return True
    phase = innermost(state)
    return phase is not None and phase.name in STARTUP_PHASES and not own_work(state)


def states_evidence(view: View, ranks: list[int]) -> dict[str, str]:
    """{rank: its activity and the frame that decided it}, or why it is not known:
    a verdict says whether it was read from what the ranks were doing or from
    their positions alone."""
    found = {}
    for rank in ranks:
        state = view.ranks.get(rank)
        if state is None:
            continue
        now = activity(state)
        sample = state.activity
        if now is not None:
            found[str(rank)] = f"{now} at {sample.frame}" if sample.frame else str(now)
        elif sample is None:
            found[str(rank)] = "not sampled: positions only"
        elif busy_unread(state):
            found[str(rank)] = f"busy, its stack unreadable ({sample.note})"
        elif sample.note and not sample.frames:
            found[str(rank)] = f"unreadable ({sample.note}): positions only"
        else:
            found[str(rank)] = "moved since its last sample: positions only"
    return found
