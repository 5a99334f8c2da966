"""The wait-for graph over the driver and the ranks, and its roots."""
from __future__ import annotations

from collections import defaultdict

from diagnose.analysis.doing import busy_unread, not_waiting, own_work, waits_on_peers
from diagnose.analysis.outside import stack_waits
from diagnose.analysis.position import (entered_step, innermost, milestone, open_step,
                                        tp_peers)
from diagnose.analysis.view import DRIVER, Node, View, gpu_behind, unfinished
from diagnose.core.snapshot import CollectiveRecord, RankState
from diagnose.core.vocab import MILESTONES, P2P_OPS, STARTUP_PHASES, Phase, Role, paired_op

DRIVER_WAITS = (Phase.EXECUTE_MODEL, Phase.SAMPLE)  # the driver waits on the output rank


def wait_for_graph(view: View) -> dict[Node, set[Node]]:
    graph: dict[Node, set[Node]] = {rank: set() for rank in view.ranks}
    driver = view.driver
    if driver is not None:
        graph[DRIVER] = set()
    for rank, state in view.ranks.items():
        if rank in view.deaths:
            continue
        record = view.pending.get(rank)
        if record is not None:
            graph[rank] |= record_waits(view, rank, record)
            if gpu_behind(record):
                continue               # it waits on its own GPU, whatever its host does next
        elif state.only_stacks:
            graph[rank] |= stack_waits(view, rank, state)
        elif state.identity.role == Role.WORKER:
            graph[rank] |= unseen_waits(view, rank, state)
        phase = innermost(state)
        if (driver is not None and phase is not None and phase.name == Phase.DEQUEUE
                and state.ring_read >= driver.ring_written):
            graph[rank].add(DRIVER)
    if driver is not None and DRIVER not in view.deaths:
        phase = innermost(driver)
        output = view.output_rank()
        if phase is not None and phase.name in DRIVER_WAITS and output is not None:
            graph[DRIVER].add(output)
    return graph


def unseen_waits(view: View, rank: int, state: RankState) -> set[Node]:
    """A worker inside a phase with no collective in sight may still wait in one
    the probe cannot see (a compiled model's all-reduce, a CUDA graph replay): on
    the TP peers that have not begun its step, or, in a start-up phase, that have
    not reached or not finished it. A peer that went on past the rank is no
    reason for it to wait; a rank seen doing its own work in a start-up phase
    (a profile run's GEMM) waits on no one."""
    peers = tp_peers(view, rank)
    step = open_step(state)
    if step is not None:
        behind = {peer for peer in peers if entered_step(view.ranks[peer]) < step}
        return behind | _same_step_waits(view, state, step, peers)
    phase = innermost(state)
    if phase is None or phase.name not in STARTUP_PHASES:
        return set()
    if not_waiting(state):
        return set()                   # seen doing its own work: it waits on no one
    mine = MILESTONES.index(phase.name)
    return {peer for peer in peers if milestone(view.ranks[peer]) < mine
            or _inside(view.ranks[peer], phase.name)}


def _same_step_waits(view: View, state: RankState, step: int, peers: list[int]) -> set[Node]:
    """Peers that began the rank's step too, yet leave it waiting: one that left the
    step by an exception (whether or not it began a later step since: vLLM's worker
    catches the exception and takes the next batch of a pipeline), and, where the
    rank is seen waiting in a collective (or on its GPU), one seen inside the step
    doing something else (running, sleeping, compiling). A rank not seen at work of
    its own waits on a peer in the step whose stack could not be read while it used
    CPU (a compile py-spy failed on): one cause, one culprit. Where what they do is
    not known, positions alone decide."""
    raised = {peer for peer in peers if left_by_error(view.ranks[peer], step)}
    same = [peer for peer in peers if entered_step(view.ranks[peer]) == step]
    inside = [peer for peer in same if open_step(view.ranks[peer]) == step]
    if waits_on_peers(state):
        return raised | {peer for peer in inside if not_waiting(view.ranks[peer])}
    if not own_work(state):
        return raised | {peer for peer in inside if busy_unread(view.ranks[peer])}
    return raised


def left_by_error(state: RankState, step: int) -> bool:
    """The rank left execute_model step `step` by an exception."""
    error = state.error
    return error is not None and error.step == step and open_step(state) != step


def _inside(state: RankState, name: str) -> bool:
    return any(event.name == name for event in state.open_phases)


def record_waits(view: View, rank: int, record: CollectiveRecord) -> set[Node]:
    """The ranks that `rank`, blocked in `record`, waits on."""
    if gpu_behind(record):
        return set()                   # it waits on its own GPU
    if record.op in P2P_OPS:
        peer = record.peer
        if peer not in view.ranks:
            return {peer} if peer in view.unreadable else set()
        other_op = paired_op(record.op)
        match = view.p2p.get((record.group, other_op, peer, rank, record.seq))
        matched = view.highest_seq.get((record.group, other_op, peer, rank), -1) >= record.seq
        if matched and (match is None or not unfinished(match)):
            return set()
        return {peer}
    return view.blockers(record.group, record.seq) - {rank}


def waited_by(graph: dict[Node, set[Node]]) -> dict[Node, set[Node]]:
    """Node -> the nodes with an edge to it: what reachers() walks."""
    reverse: dict[Node, set[Node]] = defaultdict(set)
    for node, outs in graph.items():
        for out in outs:
            reverse[out].add(node)
    return reverse


def reachers(reverse: dict[Node, set[Node]], targets: set[Node]) -> set[Node]:
    """Every node with a path to one of `targets` (the targets excluded);
    `reverse` is waited_by(graph), made once per graph."""
    seen, todo = set(), list(targets)
    while todo:
        for node in reverse.get(todo.pop(), ()):
            if node not in seen:
                seen.add(node)
                todo.append(node)
    return seen - targets


def terminal_components(graph: dict[Node, set[Node]]) -> list[set[Node]]:
    """Strongly connected components with no edge leaving them: the roots, in
    the order of their first node in `graph`.

    Tarjan's algorithm, iterative, so linear in the edges: a collective that
    a thousand ranks sit in gives a million of them (each waits on every
    other member still inside it)."""
    order = {node: index for index, node in enumerate(graph)}
    index: dict[Node, int] = {}
    low: dict[Node, int] = {}
    stack: list[Node] = []
    on_stack: set[Node] = set()
    roots = []
    for start in graph:
        if start in index:
            continue
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        work = [(start, iter(graph[start]))]
        while work:
            node, edges = work[-1]
            for out in edges:
                if out not in index:
                    index[out] = low[out] = len(index)
                    stack.append(out)
                    on_stack.add(out)
                    work.append((out, iter(graph.get(out, ()))))
                    break
                if out in on_stack and index[out] < low[node]:
                    low[node] = index[out]
            else:
                work.pop()
                if work and low[node] < low[work[-1][0]]:
                    low[work[-1][0]] = low[node]
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if node in order and all(out in component for member in component
                                             for out in graph.get(member, ())):
                        roots.append(component)
    return sorted(roots, key=lambda component: min(order[node] for node in component
                                                   if node in order))
