"""The selected rank's evidence: its stack, phase timeline, recent collectives and log tail."""
from __future__ import annotations

from dataclasses import dataclass, field

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.reactive import reactive
from textual.widgets import Static

from diagnose.core.shown import shown
from diagnose.core.snapshot import RankState
from diagnose.offline.report import collective_label

TIMELINE_LEN = 10
COLLECTIVES_LEN = 8


@dataclass
class RankView:
    """Everything the detail shows for one rank at one moment."""
    state: RankState
    word: str                 # the grid's state word
    now: float                # the snapshot's time: ages are relative to it
    stack_source: str         # "py-spy", "py-spy --native", "dump" or "probe"
    stack: list[str]
    log_name: str | None      # None: the run dir has no log for this rank
    log_tail: list[str] = field(default_factory=list)


def header_text(view: RankView) -> str:
    state = view.state
    ident = state.identity
    where = f"stage {ident.pp_rank} · tp {ident.tp_rank}" if ident.pp_rank is not None else ident.role
    if ident.label:
        where = f"{ident.label} · {where}"
    lines = [f"rank {ident.rank} · {where} · {view.word} · pid {ident.pid} on {ident.host} · {ident.device}"]
    if state.fault is not None:
        fired = (f"fired at +{state.fault.fired_at - state.started_at:.3f}s" if state.fault.fired_at
                 else "not fired yet")
        lines.append(f"fault injected: {state.fault.spec} ({fired})")
    return "\n".join(lines)


def timeline_text(view: RankView) -> str:
    state = view.state
    lines = []
    for event in state.phases[-TIMELINE_LEN:]:
        step = f" step {event.step}" if event.step is not None else ""
        took = f"{event.end - event.start:.3f}s" if event.end is not None else f"open {view.now - event.start:.1f}s"
        offset = f"+{event.start - state.started_at:.3f}s"
        lines.append(f"{offset:>10}  {event.name}{step}  {took}")
    return "\n".join(lines) or "no phase yet"


def collectives_text(view: RankView) -> str:
    lines = []
    for record in view.state.collectives[-COLLECTIVES_LEN:]:
        shapes = " ".join("x".join(map(str, shape)) for shape in record.shapes)
        if record.t_complete is not None:
            done = f"done in {1000 * (record.t_complete - record.t_enqueue):.1f}ms"
        else:
            done = f"waiting {view.now - record.t_enqueue:.1f}s"
        lines.append(f"{collective_label(record)} [{shapes}] {record.dtype}  {done}  {record.site}")
    return "\n".join(lines) or "no collective yet"


def log_text(view: RankView) -> str:
    if view.log_name is None:
        return "no log file for this rank in the run dir"
    return "\n".join(view.log_tail) or f"{view.log_name} is empty"


class RankDetail(VerticalScroll, can_focus=True):
    view: reactive[RankView | None] = reactive(None)

    def compose(self) -> ComposeResult:
        yield Static(id="detail-header")
        yield Static(id="detail-stack", classes="detail-section")   # first: where it is stuck
        yield Static(id="detail-timeline", classes="detail-section")
        yield Static(id="detail-collectives", classes="detail-section")
        yield Static(id="detail-log", classes="detail-section")

    def on_mount(self) -> None:
        self.query_one("#detail-timeline").border_title = "phases"
        self.query_one("#detail-collectives").border_title = "collectives"
        self.query_one("#detail-log").border_title = "log"

    def watch_view(self, view: RankView | None) -> None:
        if view is None:
            return
        # Text(...) keeps "[...]" in frames and logs from being read as markup
        self.query_one("#detail-header", Static).update(_safe(header_text(view)))
        self.query_one("#detail-timeline", Static).update(_safe(timeline_text(view)))
        self.query_one("#detail-collectives", Static).update(_safe(collectives_text(view)))
        stack = self.query_one("#detail-stack", Static)
        stack.border_title = f"stack ({view.stack_source}) · innermost first"
        stack.update(_safe("\n".join(view.stack)))
        log = self.query_one("#detail-log", Static)
        log.border_title = f"log ({shown(view.log_name)})" if view.log_name else "log"
        log.update(_safe(log_text(view)))


MAIN_THREAD = "MainThread"
PROBE_THREAD = "diag-heartbeat"


def stack_lines(stacks: dict[str, list[str]]) -> list[str]:
    """Thread by thread, the main thread first and diag's own last, innermost frame
    first (as py-spy prints them): the frame a rank is stuck in is the top line."""
    order = sorted(stacks, key=lambda name: (name != MAIN_THREAD, name == PROBE_THREAD))
    return [line for name in order
            for line in (f"thread {name}", *(f"  {frame}" for frame in reversed(stacks[name])))]


def _safe(text: str) -> Text:
    """What the rank's files and logs say, escaped: nothing raw reaches the terminal."""
    return Text(shown(text, lines=True))
