"""A caught exception is a root cause: the rank whose phase ended in the job's
first exception, where its peers then wait on it (or it died of it).

An engine may catch the exception and send the rank back to wait for work
(vLLM's worker does), while its TP peers sit in the step's all-reduce for good:
by positions the peers look stuck and the rank idle. The first exception of
the job is the cause; exceptions after a death are what the death set off, and
an exception in dequeue, shutdown or exit is the engine being ended.
"""
from __future__ import annotations

from diagnose.analysis.doing import states_evidence
from diagnose.analysis.graph import reachers, waited_by
from diagnose.analysis.position import last_progress, limit_phase, seen_until, where
from diagnose.analysis.thresholds import StallLimits
from diagnose.analysis.view import DRIVER, Node, View
from diagnose.analysis.wording import Words, rank_evidence, ranks_of, who
from diagnose.core.layout import rank_list, tp_group_name
from diagnose.core.snapshot import PhaseEvent, RaisedError, RankState, Verdict
from diagnose.core.vocab import Mention, Phase, VerdictKind

ENDING_PHASES = (Phase.DEQUEUE, Phase.SHUTDOWN, Phase.EXIT)


def raised_verdicts(view: View, graph: dict[Node, set[Node]], limits: StallLimits) -> list[Verdict]:
    first = first_error(view)
    if first is None:
        return []
    rank, error = first
    victims = reachers(waited_by(graph), {rank})
    died = rank in view.deaths
    fell = {node for node in view.deaths if node != rank}   # all after it (first_error)
    stalls = [seen_until(view, node) - max(last_progress(view.state(node)), error.at)
              for node in victims if _stalled(view, node, error, limits)]
    left = left_waiting(view, rank, error)
    if not died and not stalls and not fell and not left:
        return []
    victims |= set(left)
    stalls += list(left.values())
    state = view.ranks[rank]
    after = ("; it died" if died else "; its process ended" if not state.alive
             else f"; it went on and is now {where(state).removeprefix('stuck ')}")
    if fell:
        after += f"; then {rank_list(ranks_of(fell), DRIVER in fell)} died"
    frame = f" at {error.frame}" if error.frame else ""
    step = f" step {error.step}" if error.step is not None else ""
    words = Words().culprit(who(view, rank)).add(
        f" raised {error.error} in {error.phase}{step}{frame}{after}").waiting(
        victims, exclude=set(left))
    if left:
        words.add("; ").add(rank_list(sorted(left)), Mention.VICTIMS).add(
            " waited on it until the job ended")
    evidence = rank_evidence(view, state)
    evidence["error"] = {"error": error.error, "frame": error.frame, "phase": error.phase,
                         "step": error.step, "at": error.at}
    evidence["states"] = states_evidence(view, [rank] + ranks_of(victims))
    detected = max(stalls, default=max(0.0, view.now - error.at))
    return [Verdict(kind=VerdictKind.RAISED, culprit_ranks=[rank],
                    victim_ranks=ranks_of(victims | fell),
                    summary=words.text, spans=words.spans, phase=error.phase, step=error.step,
                    detected_after_s=round(detected, 3), evidence=evidence)]


def first_error(view: View) -> tuple[int, RaisedError] | None:
    """The rank with the job's first exception, if it came before any other
    process died (its own death may follow it) and not from an ending phase."""
    errors = sorted(((state.error.at, rank) for rank, state in view.ranks.items()
                     if state.error is not None and state.error.phase not in ENDING_PHASES))
    for at, rank in errors[:1]:
        others = [death.at for node, death in view.deaths.items() if node != rank]
        if not others or at <= min(others):
            return rank, view.ranks[rank].error
    return None


def left_waiting(view: View, rank: int, error: RaisedError) -> dict[int, float]:
    """In a job that ended by itself: {peer: seconds it waited} for the TP peers
    that were in the step of the rank's exception when the job ended, or left it
    only by an exception of their own after the rank's process was gone, and made
    no progress after the exception: they waited on it to the end, however short
    the end made their wait. vLLM ends its engine a second after a worker's
    exception, before any stall limit, and `vllm serve` may exit while its
    workers still run: the raiser back in its dequeue, the peer in the step's
    all-reduce. A peer that left the step by an exception of its own while the
    rank still ran raised beside it (both asserted), and waited on nothing; one
    that finished the step needed nothing of it."""
    snapshot = view.snapshot
    if snapshot.command_exit is None or snapshot.stop is not None or error.step is None:
        return {}
    raiser = view.ranks[rank]
    members = view.groups.get(tp_group_name(raiser.identity.pp_rank), [])
    left = {}
    for peer in members:
        state = view.ranks.get(peer)
        event = None if peer == rank or state is None else _step_event(state, error)
        if event is None or _moved(state, error):
            continue
        if event.end is None:           # still in the step, or its process ended in it
            out = view.now if state.alive else state.heartbeat_at
        elif _raised_after_it_was_gone(raiser, state, event, error):
            out = event.end
        else:
            continue
        left[peer] = round(max(0.0, out - error.at), 3)
    return left


def _step_event(state: RankState, error: RaisedError) -> PhaseEvent | None:
    """The peer's phase of the same name and step as the error (entered before
    the error or after it: either way the step needs the raiser)."""
    return next((event for event in state.phases + state.open_phases
                 if event.name == error.phase and event.step == error.step), None)


def _moved(state: RankState, error: RaisedError) -> bool:
    """A traced collective of the peer's went on after the exception."""
    return any(max(record.t_enqueue, record.t_complete or 0.0) > error.at
               for record in state.collectives)


def _raised_after_it_was_gone(raiser: RankState, state: RankState, event: PhaseEvent,
                              error: RaisedError) -> bool:
    """An exception took the peer out of the step (its own error is of that step)
    after the raiser's last sign of life: a heartbeat, or a phase it entered or
    left (the raiser of a vLLM crash may assert 40 ms after its last heartbeat)."""
    own = state.error
    if raiser.alive or own is None or (own.phase, own.step) != (error.phase, error.step):
        return False
    return event.end >= raiser.last_sign_of_life


def _stalled(view: View, node: Node, error: RaisedError, limits: StallLimits) -> bool:
    since = max(last_progress(view.state(node)), error.at)
    return seen_until(view, node) - since >= limits.limit(limit_phase(view, node))
