"""The roots of the wait-for graph that stalled: never reached a phase, stuck in
one, stopped taking the broadcast, a GPU that stopped, or a cycle."""
from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import asdict

from diagnose.analysis.doing import sample_wait, states_evidence, tied_peers, waits_for_absent
from diagnose.analysis.graph import reachers, terminal_components, waited_by
from diagnose.analysis.outside import stack_text
from diagnose.analysis.position import (current_step, device_progress, entered_step, innermost,
                                        last_progress, last_step, limit_phase, milestone,
                                        open_step, phase_name, ring_behind, seen_until,
                                        stall_start, tp_peers, where)
from diagnose.analysis.starved import excused, wait_evidence
from diagnose.analysis.thresholds import StallLimits
from diagnose.analysis.view import DRIVER, Node, View, driver_shutting_down, gpu_behind
from diagnose.analysis.wording import (Words, at_frame, call_name, rank_evidence, rank_list,
                                       ranks_of, step_text, who)
from diagnose.core.snapshot import RankState, Verdict
from diagnose.core.vocab import MILESTONES, P2P_OPS, STARTUP_PHASES, Phase, Role, VerdictKind


def root_verdicts(view: View, graph: dict[Node, set[Node]], limits: StallLimits,
                  named: set[int]) -> list[Verdict]:
    """One verdict for each root of the wait-for graph that has stalled; one for
    each set of stalled roots tied by positions."""
    found, reverse = [], waited_by(graph)
    stuck: dict[int, tuple[Verdict, set[Node]]] = {}    # worker roots stuck in their step
    for component in terminal_components(graph):
        if component & (named | set(view.deaths)):
            continue
        victims = reachers(reverse, component)
        if len(component) == 1:
            node = next(iter(component))
            verdict = _single_root(view, node, victims, limits)
            if verdict is not None and node != DRIVER and verdict.kind == VerdictKind.STUCK_IN_PHASE:
                stuck[node] = (verdict, victims)
                continue
        else:
            verdict = _cycle_root(view, component, victims, limits)
        if verdict is not None:
            found.append(verdict)
    found += _ties(view, stuck)
    return sorted(found, key=lambda verdict: -(verdict.detected_after_s or 0.0))


def _ties(view: View, stuck: dict[int, tuple[Verdict, set[Node]]]) -> list[Verdict]:
    """The verdicts of stuck roots, those tied with each other by positions
    (doing.tied_peers: TP peers inside the same step, nothing pending) made one:
    one of them holds the others, and where no sample said which, naming each as
    the one culprit would name victims."""
    verdicts, placed = [], set()
    for rank in sorted(stuck):
        if rank in placed:
            continue
        tie = [rank] + [peer for peer in tied_peers(view, rank) if peer in stuck]
        placed.update(tie)
        verdicts.append(stuck[rank][0] if len(tie) == 1 else
                        _tie_verdict(view, {member: stuck[member] for member in tie}))
    return verdicts


def _tie_verdict(view: View, tie: dict[int, tuple[Verdict, set[Node]]]) -> Verdict:
    members = sorted(tie)
    victims = set().union(*(waiting for _, waiting in tie.values())) - set(members)
    each = [verdict for verdict, _ in tie.values()]
    first = view.ranks[members[0]]
    stall = min(verdict.detected_after_s for verdict in each)
    both = len(members) == 2
    words = Words().culprit(rank_list(members)).add(
        f" are {'both' if both else 'all'} {where(first)}{step_text(first)} for {stall:.0f} s "
        f"with nothing pending: one of them holds the {'other' if both else 'others'}, and "
        f"nothing they were seen doing says which").waiting(victims, on="them")
    evidence = {"tied": members, "states": states_evidence(view, ranks_of(victims) + members),
                "each": {str(rank): tie[rank][0].evidence for rank in members}}
    return Verdict(kind=VerdictKind.STUCK_IN_PHASE, culprit_ranks=members,
                   victim_ranks=ranks_of(victims), summary=words.text, spans=words.spans,
                   phase=each[0].phase, step=each[0].step, detected_after_s=stall,
                   evidence=evidence)


def _single_root(view: View, node: Node, victims: set[Node], limits: StallLimits) -> Verdict | None:
    state = view.state(node)
    has_phase = innermost(state) is not None
    if not state.alive:
        return None                      # it ended, and not as a death (dead_verdicts' part)
    if node == DRIVER and not has_phase:
        return None                      # an idle driver: the server has nothing to do
    if not has_phase and not victims and (state.identity.role != Role.WORKER
                                          or state.only_stacks):
        return None                      # nothing says this process should be doing anything
    if not has_phase and (view.snapshot.command_exit is not None
                          or driver_shutting_down(view.snapshot)):
        return None                      # the job is ending: the rank is on its way out
    if node in view.pending and gpu_behind(view.pending[node]):
        return _gpu_stuck(view, node, victims, limits)
    since = stall_start(view, _stalled_since(view, node, victims))
    until = seen_until(view, node)
    stall, limit = until - since, limits.limit(limit_phase(view, node))
    waited = excused(view, node, since, until)
    if stall < limits.stretched(limit, waited) + sample_wait(view, node):
        return None
    if node != DRIVER and waits_for_absent(view, state):
        return None                      # it waits on a rank not up yet
    kind, reached, missed_step = _root_kind(view, node)
    group, seq = _waited_collective(view, node, victims)
    if kind == VerdictKind.STUCK_IN_PHASE and not (state.phases or state.open_phases) and group is not None:
        kind = VerdictKind.COLLECTIVE_MISSING_PEERS
    step = current_step(state) if missed_step is None else missed_step
    if reached is not None and missed_step is not None:
        reached = f"{reached} step {missed_step}"
    words = _root_words(view, node, kind, reached, stall, group, seq).waiting(victims)
    evidence = rank_evidence(view, state)
    if node == DRIVER:
        evidence["culprit"] = DRIVER
    evidence["states"] = states_evidence(view, ranks_of({node} | victims))
    evidence |= wait_evidence(limits, limit, {node: waited})
    phase = reached.split()[0] if kind == VerdictKind.NEVER_REACHED else phase_name(state)
    return Verdict(kind=kind, culprit_ranks=ranks_of({node}), victim_ranks=ranks_of(victims),
                   summary=words.text, spans=words.spans, phase=phase, step=step,
                   group=group, seq=seq, detected_after_s=round(stall, 3), evidence=evidence)


def _gpu_stuck(view: View, node: int, victims: set[Node], limits: StallLimits) -> Verdict | None:
    """The rank's host enqueued a call and went on; its GPU never reached the call."""
    state = view.ranks[node]
    record = view.pending[node]
    stall = seen_until(view, node) - max(record.t_enqueue, device_progress(state))
    if stall < limits.limit(limit_phase(view, node)):
        return None
    done = [r for r in state.collectives if r.t_device_done is not None]
    after = f", after {call_name(done[-1])}" if done else ""
    site = f" (enqueued at {record.site})" if record.site else ""
    words = Words().culprit(who(view, node)).add(
        f": the GPU has not reached {call_name(record)}{site} for {stall:.0f} s, stuck in the "
        f"work before it{after}; the host is {where(state).removeprefix('stuck ')}"
        f"{step_text(state)}{at_frame(state)}").waiting(victims)
    evidence = rank_evidence(view, state)
    evidence["device"] = {"not_reached": asdict(record),
                          "last_finished": asdict(done[-1]) if done else None,
                          "host": f"{where(state).removeprefix('stuck ')}{at_frame(state)}"}
    evidence["victims_on_device"] = {
        str(rank): call_name(view.pending[rank]) for rank in ranks_of(victims)
        if rank in view.pending and view.pending[rank].t_device_start is not None}
    return Verdict(kind=VerdictKind.GPU_STUCK, culprit_ranks=[node],
                   victim_ranks=ranks_of(victims), summary=words.text, spans=words.spans,
                   phase=phase_name(state), step=current_step(state),
                   group=record.group, seq=record.seq, detected_after_s=round(stall, 3),
                   evidence=evidence)


def _cycle_root(view: View, component: set[Node], victims: set[Node],
                limits: StallLimits) -> Verdict | None:
    """Processes that wait on each other: a deadlock, or a collective stuck with all
    its members inside."""
    limit = max(limits.limit(limit_phase(view, node)) for node in component)
    spans = {node: (stall_start(view, last_progress(view.state(node))), seen_until(view, node))
             for node in component}
    waited = {node: excused(view, node, *spans[node]) for node in component}
    if any(until - since < limits.stretched(limit, waited[node])
           for node, (since, until) in spans.items()):
        return None
    stall = min(until - since for since, until in spans.values())
    members = ranks_of(component)
    first = view.state(members[0] if members else DRIVER)
    record = view.pending.get(members[0]) if members else None
    names = Words().culprit(rank_list(members, driver=DRIVER in component))
    if _unseen_cycle(view, component):   # start-up peers: the waits are graph.unseen_waits'
        words = names.add(f" are all stuck in {phase_name(first)} for {stall:.0f} s, none "
                          f"in a collective the probe can see")
    else:
        what = (f"{record.group} {record.op} seq {record.seq}" if record is not None
                else phase_name(first) or "their phases")
        words = names.add(f" wait on each other in {what} for {stall:.0f} s")
    words.waiting(victims)
    return Verdict(kind=VerdictKind.STUCK_IN_PHASE, culprit_ranks=members,
                   victim_ranks=ranks_of(victims), summary=words.text, spans=words.spans,
                   phase=phase_name(first), step=current_step(first),
                   group=record.group if record else None, seq=record.seq if record else None,
                   detected_after_s=round(stall, 3),
                   evidence={"cycle": [str(node) for node in sorted(component, key=str)],
                             "states": states_evidence(view, members)}
                   | wait_evidence(limits, limit, waited))


def _unseen_cycle(view: View, component: set[Node]) -> bool:
    """Workers in a start-up phase, none in a call the probe sees."""
    return DRIVER not in component and all(
        node not in view.pending and phase_name(view.ranks[node]) in STARTUP_PHASES
        for node in component)


def _stalled_since(view: View, node: Node, victims: set[Node]) -> float:
    """When the process stopped moving. A worker that has not read a broadcast its
    peers took stalls from the moment they started that step; a rank that left
    no trace at all (a missing dump) from when the first rank began to wait; a
    rank known only by its stacks from when they last moved."""
    state = view.state(node)
    if state.only_stacks:
        return state.frame_moved_at or state.started_at
    if node != DRIVER and not (state.collectives or state.phases or state.open_phases):
        waits = [view.pending[rank].t_enqueue for rank in ranks_of(victims) if rank in view.pending]
        return min(waits, default=state.started_at)
    since = last_progress(state)
    if node != DRIVER and ring_behind(view, node):
        done = last_step(state)
        firsts = view.memo("step starts", lambda: _first_step_starts(view))
        starts = [next((at for at, rank in first if rank != node), None)
                  for step, first in firsts.items() if done is None or step > done]
        starts = [start for start in starts if start is not None]
        if starts:
            since = max(since, min(starts))
    return since


def _first_step_starts(view: View) -> dict[int, list[tuple[float, int]]]:
    """For each step, the two ranks that began its execute_model first: (start, rank)."""
    starts: dict[int, dict[int, float]] = defaultdict(dict)
    for rank, state in view.ranks.items():
        for event in state.phases + state.open_phases:
            if event.name == Phase.EXECUTE_MODEL and event.step is not None:
                began = starts[event.step]
                began[rank] = min(event.start, began.get(rank, event.start))
    return {step: heapq.nsmallest(2, ((at, rank) for rank, at in began.items()))
            for step, began in starts.items()}


def _root_kind(view: View, node: Node) -> tuple[VerdictKind, str | None, int | None]:
    """The verdict kind for a stalled root, and the phase (and step) it never reached."""
    if node == DRIVER:
        return VerdictKind.STUCK_IN_PHASE, None, None
    state = view.ranks[node]
    if state.identity.role == Role.PROCESS:
        missed = _phase_missed(view, node)
        if missed is not None:
            return VerdictKind.NEVER_REACHED, missed, None
    furthest = _furthest_milestone(view, node)
    if milestone(state) < furthest:
        return VerdictKind.NEVER_REACHED, MILESTONES[furthest], None
    if ring_behind(view, node):
        return VerdictKind.BROADCAST_NOT_CONSUMED, None, None
    step = _step_missed(view, node)
    if step is not None:
        return VerdictKind.NEVER_REACHED, Phase.EXECUTE_MODEL, step
    return VerdictKind.STUCK_IN_PHASE, None, None


def _furthest_milestone(view: View, node: int) -> int:
    """The furthest milestone any other rank reached (-1: none)."""
    top = view.memo("milestones", lambda: heapq.nlargest(
        2, ((milestone(state), rank) for rank, state in view.ranks.items())))
    return max((reached for reached, rank in top if rank != node), default=-1)


def _step_missed(view: View, node: int) -> int | None:
    """The step a worker's TP peers are inside while it, outside execute_model,
    never began it."""
    state = view.ranks[node]
    if open_step(state) is not None:
        return None
    ahead = [open_step(view.ranks[peer]) for peer in tp_peers(view, node)]
    step = max((step for step in ahead if step is not None), default=None)
    return step if step is not None and step > entered_step(state) else None


def _phase_missed(view: View, node: Node) -> str | None:
    """Generic mode (phases from --mark): the first phase every other process
    entered and this one never did."""
    if len(view.ranks) < 2:
        return None
    state = view.ranks[node]
    own = {event.name for event in state.phases + state.open_phases}
    counts, earliest = view.memo("phases entered", lambda: _phases_entered(view))
    # a phase every other rank entered and this one did not: entered by all but one
    missed = [name for name, count in counts.items()
              if count == len(view.ranks) - 1 and name not in own]
    return min(missed, key=earliest.__getitem__, default=None)


def _phases_entered(view: View) -> tuple[dict[str, int], dict[str, float]]:
    """Phase name -> how many ranks entered it, and the earliest of their last
    entries into it."""
    counts: dict[str, int] = defaultdict(int)
    earliest: dict[str, float] = {}
    for state in view.ranks.values():
        last = {event.name: event.start for event in state.phases + state.open_phases}
        for name, start in last.items():
            counts[name] += 1
            earliest[name] = min(start, earliest.get(name, start))
    return counts, earliest


def _waited_collective(view: View, node: Node, victims: set[Node]) -> tuple[str | None, int | None]:
    """The group collective that victims wait in for this rank to join; where
    several, the one this rank alone is missing from (what the majority did)."""
    candidates = set()
    for rank in ranks_of(victims):
        record = view.pending.get(rank)
        if (record is not None and record.op not in P2P_OPS and node in view.member_set(record.group)
                and not view.has_joined(node, record.group, record.seq)):
            candidates.add((record.group, record.seq))
    if not candidates:
        return None, None

    def missing(candidate):
        group, seq = candidate
        return view.memo(("missing", group, seq), lambda: sum(
            not view.has_joined(member, group, seq) for member in view.groups[group]))

    return min(candidates, key=lambda candidate: (missing(candidate), candidate))


def _root_words(view: View, node: Node, kind: VerdictKind, reached: str | None, stall: float,
                group: str | None, seq: int | None) -> Words:
    state = view.state(node)
    words = Words().culprit(who(view, node))
    if state.phases or state.open_phases:
        stuck = f"{where(state)}{step_text(state)} for {stall:.0f} s{at_frame(state)}"
    elif state.only_stacks:
        return words.add(f" {stack_text(state, stall)}")
    else:
        stuck = _last_call_text(state, stall)
    if kind == VerdictKind.NEVER_REACHED:
        return words.add(f" never reached {reached}: {stuck}")
    if kind == VerdictKind.BROADCAST_NOT_CONSUMED:
        return words.add(f" {_unread_broadcast(view, node)}; {stuck}")
    if kind == VerdictKind.COLLECTIVE_MISSING_PEERS:
        op = next(record.op for record in view.pending.values()
                  if (record.group, record.seq) == (group, seq))
        return words.add(f" never joined {group} {op} seq {seq}: {stuck}")
    return words.add(f" {stuck}")


def _unread_broadcast(view: View, node: int) -> str:
    """'has not read broadcast #57 that ranks 0, 2 and 3 read 12 s ago (it read 56 of
    57 messages)': the message it stopped at, and when its peers took it."""
    read = view.ranks[node].ring_read
    readers = {rank: state for rank, state in view.ranks.items()
               if rank != node and state.ring_read > read}
    taken = [when for state in readers.values()
             if (when := _time_read(state, read + 1)) is not None]
    ago = f" {view.now - min(taken):.0f} s ago" if taken else ""
    return (f"has not read broadcast #{read + 1} that {rank_list(readers)} read{ago} (it read "
            f"{read} of {view.driver.ring_written} messages)")


def _time_read(state: RankState, message: int) -> float | None:
    """When a worker took broadcast `message`: the end of the dequeue that took it
    (one message each), if its phase ring still holds that dequeue."""
    dequeues = sorted(event.end for event in state.phases
                      if event.name == Phase.DEQUEUE and event.end is not None)
    back = state.ring_read - message + 1
    return dequeues[-back] if 0 < back <= len(dequeues) else None


def _last_call_text(state: RankState, stall: float) -> str:
    """Where a rank without phase data is: its last collective call."""
    if not state.collectives:
        return "it made no collective call"
    record = state.collectives[-1]
    site = f" at {record.site}" if record.site else ""
    return (f"its last call, {record.group} {record.op} seq {record.seq}{site}, "
            f"was {stall:.0f} s before the snapshot")
