"""Where a process is in its phases and steps, and when it last moved."""
from __future__ import annotations

import heapq

from diagnose.analysis.view import DRIVER, Node, View
from diagnose.core.layout import tp_group_name
from diagnose.core.snapshot import PhaseEvent, RankState
from diagnose.core.vocab import MILESTONES, STARTUP_PHASES, Activity, Phase, Role

LATE_HEARTBEAT_S = 0.5    # five heartbeats: a process this late was not run
FREEZE_GRACE_S = 3.0      # a freeze this long is the host's doing, not a hang


def innermost(state: RankState) -> PhaseEvent | None:
    return state.open_phases[-1] if state.open_phases else None


def last_progress(state: RankState) -> float:
    """A phase boundary or a collective event; in a start-up phase also a move of
    the main thread's frame, or a state sample that found the process computing
    (compiling, loading weights or a profile run's long kernels run long and
    never block, which a hang does); in any phase, a sample that read no stack
    but found the process using CPU (py-spy failed on a compiling rank: a
    compile and a spin look alike there, and a wrong verdict is the worse error).
    A rank whose rings a node's agent held back while it moved brings its last
    progress as a time (`progress_at`)."""
    times = [state.started_at]
    if state.progress_at is not None:
        times.append(state.progress_at)
    for event in state.phases + state.open_phases:
        times.append(event.start if event.end is None else event.end)
    for record in state.collectives:
        times.append(record.t_enqueue if record.t_complete is None else record.t_complete)
    phase = innermost(state)
    starting = phase is not None and phase.name in STARTUP_PHASES
    if starting and state.frame_moved_at is not None:
        times.append(state.frame_moved_at)
    sample = state.activity
    if sample is not None and sample.busy and sample.pid == state.identity.pid and (
            sample.activity == Activity.UNKNOWN   # no stack read: a compile, as like as a spin
            or starting and sample.activity == Activity.RUNNING):
        times.append(sample.taken_at)
    return max(times)


def stall_start(view: View, since: float) -> float:
    """When a stall that began at `since` counts from: not before the job's last
    compile (View.compiled_at), which the waits until then are waits for."""
    return since if view.compiled_at is None else max(since, view.compiled_at)


def seen_until(view: View, node: Node) -> float:
    """Until when a live process is known to have run without progress: now, or
    its last heartbeat where that is late. A process the machine did not run
    for a moment (a loaded host) is not stuck for that moment; a freeze longer
    than FREEZE_GRACE_S (a C call that holds the GIL, SIGSTOP) counts, beyond
    the grace. A rank whose agent holds its rings back was moving at its last
    progress, and is judged by them once they come."""
    state = view.state(node)
    if state.progress_at is not None:
        return state.progress_at
    frozen = view.now - state.heartbeat_at
    if not state.alive or frozen <= LATE_HEARTBEAT_S:
        return view.now
    return state.heartbeat_at + max(0.0, frozen - FREEZE_GRACE_S)


def device_progress(state: RankState) -> float:
    """The last time the rank's GPU was seen to finish a traced call or a step
    phase's work."""
    return max([record.t_device_done for record in state.collectives
                if record.t_device_done is not None]
               + [state.device_done_at or state.started_at], default=state.started_at)


def current_step(state: RankState) -> int | None:
    for event in reversed(state.open_phases):
        if event.step is not None:
            return event.step
    return last_step(state)


def last_step(state: RankState) -> int | None:
    """The last step the rank finished."""
    steps = [event.step for event in state.phases if event.name == Phase.EXECUTE_MODEL
             and event.step is not None and event.end is not None]
    return max(steps) if steps else None


def open_step(state: RankState) -> int | None:
    """The step of the execute_model the rank is inside, if any."""
    return next((event.step for event in reversed(state.open_phases)
                 if event.name == Phase.EXECUTE_MODEL), None)


def entered_step(state: RankState) -> int:
    """The last step whose execute_model the rank began (-1: none)."""
    return max((event.step for event in state.phases + state.open_phases
                if event.name == Phase.EXECUTE_MODEL and event.step is not None), default=-1)


def tp_peers(view: View, rank: int) -> list[int]:
    """The other live ranks of the rank's TP group."""
    ident = view.ranks[rank].identity
    group = view.groups.get(tp_group_name(ident.pp_rank), []) if ident.pp_rank is not None else []
    return [peer for peer in group if peer != rank and peer in view.ranks
            and peer not in view.deaths]


def position(state: RankState) -> tuple[float, int] | None:
    """How far a worker is through the step loop: (step, phases finished inside
    the step). Between steps counts as step + 0.5; None without phase data."""
    open_step = next((event for event in reversed(state.open_phases)
                      if event.name == Phase.EXECUTE_MODEL), None)
    if open_step is not None and open_step.step is not None:
        done = sum(1 for event in state.phases
                   if event.end is not None and event.start >= open_step.start)
        return (open_step.step, done)
    step = last_step(state)
    if step is not None:
        return (step + 0.5, 0)
    if state.phases or state.open_phases:
        return (-1, 0)
    return None


def milestone(state: RankState) -> int:
    """Index in MILESTONES of the furthest start-up/step phase the rank entered."""
    names = {event.name for event in state.phases + state.open_phases}
    reached = [index for index, name in enumerate(MILESTONES) if name in names]
    return max(reached, default=-1)


def where(state: RankState) -> str:
    phase = innermost(state)
    closed = [event for event in state.phases if event.end is not None]
    if phase is None:
        if closed:
            return f"stuck after {max(closed, key=lambda event: event.end).name}"
        return "stuck before its first phase"
    inside = [event for event in closed if event.start >= phase.start]
    if inside:
        return f"stuck in {phase.name} after {max(inside, key=lambda event: event.end).name}"
    return f"stuck in {phase.name}"


def limit_phase(view: View, node: Node) -> str | None:
    """The phase whose stall limit applies: where the process is, or for a worker
    between phases the next phase of its start-up/step sequence."""
    state = view.state(node)
    phase = innermost(state)
    if state.only_stacks:
        return None                     # nothing but its stack: the steady-state limit
    if node != DRIVER and ring_behind(view, node):
        return Phase.EXECUTE_MODEL          # a message waits to be read: a step is due
    if phase is not None:
        return phase.name
    if state.identity.role == Role.WORKER and last_closed(state) == Phase.DEQUEUE:
        return None                     # it took a message and never began the work: no
                                        # engine code runs long between these phases
    if state.identity.role == Role.WORKER:
        return MILESTONES[min(milestone(state) + 1, len(MILESTONES) - 1)]
    return last_closed(state)


def last_closed(state: RankState) -> str | None:
    closed = [event for event in state.phases if event.end is not None]
    return max(closed, key=lambda event: event.end).name if closed else None


def ring_behind(view: View, rank: int) -> bool:
    """The worker sits in dequeue without reading messages the driver wrote and
    other workers took."""
    driver, state = view.driver, view.ranks[rank]
    phase = innermost(state)
    if driver is None or phase is None or phase.name != Phase.DEQUEUE:
        return False
    read = state.ring_read
    return read < driver.ring_written and _most_read_by_another(view, rank) > read


def _most_read_by_another(view: View, rank: int) -> int:
    top = view.memo("ring reads", lambda: heapq.nlargest(
        2, ((state.ring_read, other) for other, state in view.ranks.items())))
    return max((read for read, other in top if other != rank), default=-1)


def phase_name(state: RankState) -> str | None:
    phase = innermost(state)
    return phase.name if phase is not None else None
