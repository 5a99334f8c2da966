"""Compiling is progress: no hang is named while a rank compiles (Dynamo,
Inductor, a Triton JIT, a compiler child, a compile cache lock), however long
its peers wait for it, up to the compile limit; past it, the compile is a
verdict of its own."""
from __future__ import annotations

from diagnose.analysis.doing import compiling_s
from diagnose.analysis.graph import reachers, waited_by
from diagnose.analysis.position import current_step, phase_name
from diagnose.analysis.view import Node, View
from diagnose.analysis.wording import Words, rank_evidence, ranks_of, who
from diagnose.core.snapshot import Verdict
from diagnose.core.vocab import VerdictKind


def compiling_ranks(view: View) -> dict[int, float]:
    """{rank: seconds it has compiled} for the live ranks compiling now."""
    found = {}
    for rank, state in view.ranks.items():
        seconds = compiling_s(state, view.now)
        if seconds is not None and rank not in view.deaths:
            found[rank] = seconds
    return found


def compile_limit_verdicts(view: View, graph: dict[Node, set[Node]], compiling: dict[int, float],
                           limit_s: float) -> list[Verdict]:
    verdicts = []
    reverse = waited_by(graph)
    for rank, seconds in compiling.items():
        if seconds < limit_s:
            continue
        state = view.ranks[rank]
        victims = reachers(reverse, {rank})
        sample = state.activity
        words = Words().culprit(who(view, rank)).add(
            f" has compiled for {seconds:.0f} s, past the {limit_s:g} s compile limit, at "
            f"{sample.frame}").waiting(victims)
        evidence = rank_evidence(view, state)
        evidence["compile"] = {"since": sample.compiling_since, "rule": sample.rule,
                               "frame": sample.frame}
        verdicts.append(Verdict(kind=VerdictKind.COMPILE_TOO_LONG, culprit_ranks=[rank],
                                victim_ranks=ranks_of(victims), summary=words.text,
                                spans=words.spans, phase=phase_name(state),
                                step=current_step(state), detected_after_s=round(seconds, 3),
                                evidence=evidence))
    return verdicts
