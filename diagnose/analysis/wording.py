"""The words of the verdicts: names of ranks, lists of ranks, where a rank is."""
from __future__ import annotations

import signal
from dataclasses import asdict, dataclass, field

from diagnose.analysis.position import current_step, innermost, where
from diagnose.analysis.view import DRIVER, Node, View
from diagnose.core.layout import rank_list
from diagnose.core.snapshot import CollectiveRecord, RankState, Span
from diagnose.core.vocab import Mention, Phase

LAST_RECORDS = 3                       # collective records put in a verdict's evidence


@dataclass
class Words:
    """A verdict's summary, built piece by piece, with the spans that name the
    culprit and the processes waiting on it."""
    text: str = ""
    spans: list[Span] = field(default_factory=list)

    def add(self, text: str, mention: Mention | None = None) -> Words:
        if mention is not None and text:
            self.spans.append(Span(len(self.text), len(self.text) + len(text), mention))
        self.text += text
        return self

    def culprit(self, text: str) -> Words:
        return self.add(text, Mention.CULPRIT)

    def waiting(self, victims: set[Node], exclude: set[Node] = frozenset(),
                on: str = "it") -> Words:
        """'; ranks 0-5 and the driver wait on it', or nothing without victims."""
        ranks = [rank for rank in ranks_of(victims) if rank not in exclude]
        driver = DRIVER in victims
        if not ranks and not driver:
            return self
        return self.add("; ").add(rank_list(ranks, driver), Mention.VICTIMS).add(
            f" {verb(ranks + [DRIVER] * driver)} on {on}")


def who(view: View, node: Node) -> str:
    if node == DRIVER:
        return "the driver"
    return view.ranks[node].identity.name


def verb(ranks) -> str:
    return "wait" if len(ranks) > 1 else "waits"


def step_text(state: RankState) -> str:
    phase = innermost(state)
    if phase is None or phase.name == Phase.DEQUEUE:
        return ""
    step = current_step(state)
    return f" at step {step}" if step is not None else ""


def doing(state: RankState) -> str:
    """'dequeue for step 5', 'pp_send at step 4': where a rank went on to."""
    phase = innermost(state)
    if phase is None:
        return where(state).removeprefix("stuck ")
    step = current_step(state)
    if step is None:
        return phase.name
    return f"{phase.name} {'for' if phase.name == Phase.DEQUEUE else 'at'} step {step}"


def at_frame(state: RankState) -> str:
    return f" at {state.frame}" if state.frame else ""


def exit_text(exitcode: int | None) -> str:
    if exitcode is None:
        return "process gone, exit code unknown"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = "signal"
        return f"killed by signal {-exitcode}, {name}"
    return f"exit code {exitcode}"


def signal_number(exitcode: int | None) -> int | None:
    return -exitcode if exitcode is not None and exitcode < 0 else None


def call_name(record: CollectiveRecord) -> str:
    return f"{record.group} {record.op} seq {record.seq}"


def ranks_of(nodes) -> list[int]:
    return sorted(node for node in nodes if node != DRIVER)


def rank_evidence(view: View, state: RankState) -> dict:
    """What the verdict saw of the process; one the analysis found dead is not
    alive, whatever its file last said (a worker whose exit the driver saw)."""
    node = DRIVER if state.identity.rank is None else state.identity.rank
    evidence = {
        "pid": state.identity.pid, "host": state.identity.host,
        "alive": state.alive and node not in view.deaths,
        "frame": state.frame,
        "open_phases": [f"{event.name}" + (f"[{event.step}]" if event.step is not None else "")
                        for event in state.open_phases],
        "heartbeat_age_s": round(view.now - state.heartbeat_at, 3),
        "last_records": [asdict(record) for record in state.collectives[-LAST_RECORDS:]],
    }
    if state.stacks:
        evidence["stacks"] = state.stacks
    if state.fault is not None:
        evidence["fault"] = asdict(state.fault)
    return evidence
