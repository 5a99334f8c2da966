"""From a snapshot of every rank to verdicts: who is stuck, and who is to blame.

One pure function, `analyze(snapshot)`: no I/O, no clock (now is
`snapshot.taken_at`), no import of the engine, the launcher or the TUI. It
serves the live view and the post-mortem alike.

The analysis builds a wait-for graph over the driver and the worker ranks
(graph.py):

  - a rank blocked in a collective of group G at seq S waits on each member of
    G that has not joined seq S, or joined it and is still inside it;
  - the n-th recv at b from a waits on the n-th send a->b, and the other way round;
  - a worker idle in `dequeue` that has read every broadcast message waits on
    the driver; the driver inside `execute_model` waits on the output rank
    (the last PP stage's TP rank 0).

Ranks at the root of the graph (a terminal strongly connected component: a
rank that waits on no one, or a cycle) are the culprits once they have made no
progress for longer than their phase's stall limit, counted from the job's
last compile at the earliest (a wait for a peer's compile is no stall); every
rank that reaches them is a victim (roots.py). Three rules come before the graph: a dead process
is the culprit of everything that follows (the first to die, if several;
dead.py), members that disagree on the op of one collective are a mismatch,
and a member that went past a collective seq without joining it (or past its
side of a send/recv a peer waits in) is the culprit of that collective even
where the graph has a cycle through the driver (collectives.py). On a GPU the
host returns from a collective once it is enqueued: a call the device has not
finished still counts as unfinished, and a rank whose GPU has not even reached
it waits on no one but its own GPU (`gpu_stuck`); so does a rank whose host
left a step phase while its GPU has not finished that phase's work, which is
how a single GPU shows a stop (device.py). A job that hung and was then
stopped is judged as it stood just before its first death (timeline.py), so
the hang, not the kill, is named; a job diag launch stopped (exit.json says
when), or its command did (vLLM's API server, which kills the engine core and
the workers at once: stopping.json), is judged as it stood when the stop
began, so the stop is no death. In
a multi-node job, a node whose agent went silent is `node_lost`: the verdicts
that blame its ranks, whose state is stale, give way to that one. A rank whose
probe file cannot be read is not seen, but its peers still wait on it: where
they stall, the verdict names it and says that its state is unknown
(`state_unreadable`), never a waiter. One root cause has one culprit: a later
verdict that blames a rank an earlier one explains (its culprit, or a rank
waiting on it) is folded into the earlier one as a consequence (causes.py).

The driver is not a rank: where it is a culprit or a victim, verdicts say so
in the summary and in evidence["culprit"] == "driver"; rank lists hold workers.

The modules: view.py (the snapshot indexed), position.py (where a process is
and when it last moved), graph.py, one module per rule family (dead, mismatch
with calls.py and sites.py, collectives, device, roots, straggler), causes.py
(consequences folded into their cause), wording.py (the sentences), status.py
(what each rank is under the verdicts, for the rank table and the TUI).
"""
from __future__ import annotations

from diagnose.analysis.causes import fold_consequences
from diagnose.analysis.collectives import skipped_collective_verdicts, skipped_p2p_verdicts
from diagnose.analysis.compiling import compile_limit_verdicts, compiling_ranks
from diagnose.analysis.dead import dead_verdicts, node_lost_verdicts, unreadable_verdicts
from diagnose.analysis.device import gpu_work_verdicts
from diagnose.analysis.graph import wait_for_graph
from diagnose.analysis.mismatch import mismatch_verdicts
from diagnose.analysis.raised import raised_verdicts
from diagnose.analysis.roots import root_verdicts
from diagnose.analysis.starved import with_host
from diagnose.analysis.straggler import straggler_verdicts
from diagnose.analysis.thresholds import StallLimits, Thresholds
from diagnose.analysis.timeline import recent, rewind, stopped
from diagnose.analysis.view import Node, View, driver_left, shutdown_starts
from diagnose.core.heap import gc_paused
from diagnose.core.snapshot import Snapshot, Verdict


def analyze(snapshot: Snapshot, thresholds: Thresholds | None = None) -> list[Verdict]:
    """Verdicts, the most likely root cause first; an empty list means healthy."""
    snapshot = stopped(snapshot)
    with gc_paused(freeze=False):   # its indexes: many objects, made at once (heap.py)
        verdicts = fold_consequences(_judge(recent(snapshot), thresholds or Thresholds()))
    lost = [node for node in snapshot.nodes if node.lost]
    if lost:
        verdicts = node_lost_verdicts(lost, verdicts, snapshot.taken_at)
    return with_host(verdicts, snapshot)


def _judge(snapshot: Snapshot, thresholds: Thresholds) -> list[Verdict]:
    view = View(snapshot)
    compiling = compiling_ranks(view)
    if compiling:
        # Compiling is progress: while a rank compiles, nothing is a hang but a
        # compile past its limit; a death is still a death.
        graph = wait_for_graph(view)
        return (dead_verdicts(view, graph)
                + compile_limit_verdicts(view, graph, compiling, thresholds.compile_s))
    left = driver_left(view)
    ends = [death.at for death in view.deaths.values()] + shutdown_starts(snapshot) + left
    if ends:
        # A job that hung and was then stopped: the hang, seen as it stood just before
        # the first death, the shutdown or the driver's end, is the cause; what ended
        # came after.
        first_death = min(ends)
        before = rewind(snapshot, first_death)
        hangs = hang_verdicts(View(before), StallLimits(before, thresholds))
        for verdict in hangs:
            verdict.evidence["job_ended_s_ago"] = round(view.now - first_death, 3)
        if hangs:
            return hangs
    limits = StallLimits(snapshot, thresholds)
    graph = wait_for_graph(view)
    raised = raised_verdicts(view, graph, limits)
    # the job's first exception came before every other death: those are what it set off
    deaths = [] if raised else dead_verdicts(view, graph)
    verdicts = raised + deaths + ([] if left else hang_verdicts(view, limits, raised, graph))
    return verdicts + straggler_verdicts(view, thresholds)


def hang_verdicts(view: View, limits: StallLimits, raised: list[Verdict] | None = None,
                  graph: dict[Node, set[Node]] | None = None) -> list[Verdict]:
    """The hangs; the job's first exception among them unless `raised` holds it
    already (then it only counts as named). `graph`: the view's, where made already."""
    graph = wait_for_graph(view) if graph is None else graph
    first = raised_verdicts(view, graph, limits) if raised is None else []
    verdicts = mismatch_verdicts(view)
    verdicts += skipped_collective_verdicts(view, graph, limits)
    verdicts += skipped_p2p_verdicts(view, graph, limits, verdicts)
    named = {rank for verdict in first + (raised or []) + verdicts
             for rank in verdict.culprit_ranks}
    verdicts += gpu_work_verdicts(view, graph, limits, named)
    named |= {rank for verdict in verdicts for rank in verdict.culprit_ranks}
    verdicts += root_verdicts(view, _explained(graph, named), limits, named)
    return first + verdicts + unreadable_verdicts(view, graph, limits)


def _explained(graph: dict[Node, set[Node]], named: set[int]) -> dict[Node, set[Node]]:
    """The graph without the waits of ranks already named: they wait because of
    their own fault, so whatever they wait on is no root of anything."""
    return {node: set() if node in named else waits for node, waits in graph.items()}
