"""Processes that died, ranks whose state cannot be read, and nodes whose agent
went silent: the processes the analysis cannot see as they are."""
from __future__ import annotations

from diagnose.analysis.graph import reachers, record_waits, waited_by
from diagnose.analysis.position import current_step, innermost, last_progress, phase_name
from diagnose.analysis.thresholds import StallLimits
from diagnose.analysis.view import DRIVER, Death, Node, View
from diagnose.analysis.wording import (Words, exit_text, rank_evidence, rank_list, ranks_of,
                                       signal_number, who)
from diagnose.core.layout import rank_name
from diagnose.core.snapshot import NodeState, Verdict
from diagnose.core.vocab import VerdictKind

DEATH_SLACK_S = 0.3                    # a few heartbeats: deaths closer than this are not ordered by time


def dead_verdicts(view: View, graph: dict[Node, set[Node]]) -> list[Verdict]:
    """The first process to die abnormally is the culprit; later deaths and every
    process waiting on a dead one are victims."""
    clean_end = view.snapshot.command_exit == 0
    abnormal = [death for death in view.deaths.values()
                if death.exitcode not in (0, None) or (death.exitcode is None and not clean_end)]
    if not abnormal:
        return []
    first = _first_death(view, abnormal)
    state = view.state(first.node)
    dead = set(view.deaths)
    victims = (dead | reachers(waited_by(graph), dead)) - {first.node}
    later = dead - {first.node}
    phase = innermost(state)
    step = current_step(state)
    words = Words().culprit(who(view, first.node)).add(
        f" died {view.now - first.at:.0f} s ago ({exit_text(first.exitcode)})"
        + (f" at step {step}" if step is not None else "")
        + (f" in {phase.name}" if phase is not None else ""))
    if later:
        words.add(f"; {rank_list(ranks_of(later), DRIVER in later)} died after it")
    words.waiting(victims - dead)
    evidence = rank_evidence(view, state) | {"exitcode": first.exitcode,
                                         "signal": signal_number(first.exitcode)}
    if first.node == DRIVER:
        evidence["culprit"] = DRIVER
    return [Verdict(kind=VerdictKind.DEAD, culprit_ranks=ranks_of({first.node}),
                    victim_ranks=ranks_of(victims), summary=words.text, spans=words.spans,
                    phase=phase.name if phase else None, step=step,
                    detected_after_s=round(view.now - first.at, 3), evidence=evidence)]


def _first_death(view: View, abnormal: list[Death]) -> Death:
    """The earliest death. Deaths closer together than heartbeats can order are
    ordered by cause: one that died waiting in a collective on another dead
    process (a peer's reset connection ended its wait) came after it; then the
    one that stopped making progress first is first."""
    earliest = min(death.at for death in abnormal)
    close = [death for death in abnormal if death.at - earliest <= DEATH_SLACK_S]

    def waited_on_dead(death: Death) -> bool:
        record = view.pending.get(death.node)
        return record is not None and bool(
            record_waits(view, death.node, record) & (set(view.deaths) - {death.node}))

    return min(close, key=lambda death: (waited_on_dead(death),
                                         last_progress(view.state(death.node)), death.at))


def unreadable_verdicts(view: View, graph: dict[Node, set[Node]],
                        limits: StallLimits) -> list[Verdict]:
    """A rank whose file cannot be read, that others have waited on longer than
    their stall limit: named as what it is, unknown, so that the ranks waiting
    on it are never taken for the root."""
    verdicts, reverse = [], waited_by(graph)
    for rank, why in sorted(view.unreadable.items()):
        waiting = [node for node, outs in graph.items() if rank in outs]
        stalls = [(view.now - last_progress(view.state(node)),
                   limits.limit(phase_name(view.state(node)))) for node in waiting]
        if not stalls or any(stall < limit for stall, limit in stalls):
            continue
        stall = min(stall for stall, _ in stalls)
        victims = reachers(reverse, {rank})
        words = Words().culprit(_unseen_name(view, rank)).add(
            f": its state cannot be read ({why})").waiting(victims).add(f" for {stall:.0f} s")
        verdicts.append(Verdict(
            kind=VerdictKind.STATE_UNREADABLE, culprit_ranks=[rank],
            victim_ranks=ranks_of(victims), summary=words.text, spans=words.spans,
            detected_after_s=round(stall, 3), evidence={"unreadable": why}))
    return verdicts


def _unseen_name(view: View, rank: int) -> str:
    """The rank's name as the layout its peers share gives it."""
    for state in view.ranks.values():
        ident = state.identity
        if ident.tp_size and ident.pp_size:
            return rank_name(rank, rank // ident.tp_size, ident.pp_size, rank % ident.tp_size)
    return rank_name(rank, None, None, None)


def node_lost_verdicts(lost: list[NodeState], verdicts: list[Verdict],
                       now: float) -> list[Verdict]:
    """A lost node's ranks are known only as they stood when its agent went
    silent, so the verdicts that blame them give way to one naming the node."""
    lost_ranks = {rank for node in lost for rank in node.ranks}
    blamed = [verdict for verdict in verdicts if set(verdict.culprit_ranks) & lost_ranks]
    waiting = sorted({rank for verdict in blamed for rank in verdict.victim_ranks} - lost_ranks)
    kept = [verdict for verdict in verdicts if verdict not in blamed]
    return [_node_lost(node, waiting, now) for node in lost] + kept


def _node_lost(node: NodeState, waiting: list[int], now: float) -> Verdict:
    silence = ("never reported" if node.last_seen is None
               else f"last reported {now - node.last_seen:.1f}s ago")
    ranks = rank_list(node.ranks) if node.ranks else "ranks unknown"
    words = Words().culprit(f"node {node.node_rank} ({node.host or 'host unknown'}, {ranks})")
    words.add(f" is lost: its agent {silence}; what its ranks did since is unknown")
    words.waiting(set(waiting))
    return Verdict(kind=VerdictKind.NODE_LOST, culprit_ranks=list(node.ranks),
                   victim_ranks=waiting, summary=words.text, spans=words.spans,
                   evidence={"node_rank": node.node_rank, "host": node.host,
                             "last_seen": node.last_seen})
