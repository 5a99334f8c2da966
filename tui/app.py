"""The TUI: polls a source of snapshots from a worker thread, several times a second,
and shows the verdict, the rank grid and the selected rank's evidence. Nothing here
waits on a rank: the source reads files, and a slow read only delays the next frame."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.reactive import reactive
from textual.widgets import Footer, Input, Static
from textual.worker import Worker, WorkerState

from diagnose.core.snapshot import Snapshot, Verdict
from tui.grid_model import CULPRIT, GridModel, build_grid
from tui.quit_screen import STOP, QuitScreen
from tui.rank_detail import RankDetail, RankView
from tui.rank_grid import RankGrid
from tui.verdict_bar import VerdictBar

POLL_INTERVAL_S = 0.25
LOG_TAIL_LINES = 20
LOG_TAIL_BYTES = 16 * 1024
# A rank's own output, when whoever started the ranks split it by rank; else the
# NCCL debug file `diag launch --nccl-debug` has each rank write.
RANK_LOGS = ("rank-{rank}.log", "nccl-rank-{rank}.log")
NO_CONTROLLER = "attached read-only: b and r work when the TUI runs under `diag launch --tui`"


class Source(Protocol):
    """What the TUI shows and the two things it may ask of the ranks
    (diagnose.launch.rundir has the run dir's and the launcher's)."""
    def snapshot(self) -> Snapshot: ...
    def verdicts(self, snapshot: Snapshot) -> list[Verdict]: ...
    def request_dump(self) -> list[str]: ...
    def py_spy(self, pid: int, native: bool): ...


class Controller(Protocol):
    """What `diag launch` hands the TUI to act on the job it runs."""
    def toggle_launch_blocking(self, rank: int) -> bool: ...  # the rank's new setting
    def restart(self) -> None: ...
    def stop(self) -> None: ...


@dataclass
class LogTail:
    rank: int
    name: str | None     # the file's name in the run dir; None: the rank has no log
    lines: list[str]


def read_log_tail(run_dir: str, rank: int) -> LogTail:
    """The last lines of the rank's own log, the first of RANK_LOGS that exists."""
    for pattern in RANK_LOGS:
        name = pattern.format(rank=rank)
        try:
            with open(Path(run_dir) / name, "rb") as log:
                log.seek(max(0, log.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
                data = log.read()
        except FileNotFoundError:
            continue
        return LogTail(rank, name, data.decode(errors="replace").splitlines()[-LOG_TAIL_LINES:])
    return LogTail(rank, None, [])


def status_text(snapshot: Snapshot, controller: Controller | None, blocking: set[int], query: str) -> str:
    parts = [snapshot.run_dir, f"{len(snapshot.ranks)} ranks",
             time.strftime("%H:%M:%S UTC", time.gmtime(snapshot.taken_at))]
    driver = snapshot.driver.phase if snapshot.driver else None
    if driver:
        step = f" step {driver.step}" if driver.step is not None else ""
        parts.append(f"driver in {driver.name}{step}")
    if snapshot.command_exit is not None:
        parts.append(f"command exited {snapshot.command_exit}")
    if blocking:
        ranks = ", ".join(map(str, sorted(blocking)))
        parts.append(f"CUDA_LAUNCH_BLOCKING=1 at the next restart: rank{'s' if len(blocking) > 1 else ''} {ranks}")
    if query:
        parts.append(f"filter: {query}")
    if controller is None:
        parts.append("read-only")
    return " · ".join(parts)


class DiagApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "diag"
    BINDINGS = [
        Binding("enter", "focus_detail", "Detail"),
        Binding("escape", "focus_grid", "Grid", show=False),
        Binding("s", "py_spy(False)", "py-spy"),
        Binding("n", "py_spy(True)", "native"),
        Binding("d", "dump", "Dump all"),
        Binding("b", "toggle_blocking", "Launch-blocking"),
        Binding("r", "restart", "Restart"),
        Binding("slash", "filter", "Filter"),
        Binding("q", "quit_asking", "Quit"),
    ]

    snapshot: reactive[Snapshot | None] = reactive(None, always_update=True)  # a poll may return the same object
    verdicts: reactive[list[Verdict]] = reactive(list)
    selected_rank: reactive[int | None] = reactive(None)
    query_text: reactive[str] = reactive("")
    blocking: reactive[set[int]] = reactive(set)
    read_error: reactive[str] = reactive("")  # the last poll's failure, until one succeeds

    def __init__(self, source: Source, controller: Controller | None = None) -> None:
        super().__init__()
        self.source = source
        self.controller = controller
        self.polling = False
        self.log_tail: LogTail | None = None
        self.spy_stacks: dict[int, tuple[str, list[str]]] = {}
        self.culprit_was_named = False

    def compose(self) -> ComposeResult:
        yield VerdictBar(id="verdict")
        yield Static(id="status")
        with Horizontal(id="main"):
            with VerticalScroll(id="grid-scroll"):
                yield RankGrid(id="grid")
            yield RankDetail(id="detail")
        yield Input(placeholder="filter by state (waiting, culprit, ...) or phase; empty clears",
                    id="filter")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(RankGrid).focus()
        self.poll()
        self.set_interval(POLL_INTERVAL_S, self.poll)

    # -- reading the source, off the UI thread

    def poll(self) -> None:
        if not self.polling:
            self.polling = True
            self.read_source(self.selected_rank)

    @work(thread=True, group="poll", exit_on_error=False)
    def read_source(self, rank: int | None) -> tuple[Snapshot, list[Verdict], LogTail | None]:
        snapshot = self.source.snapshot()
        verdicts = self.source.verdicts(snapshot)
        return snapshot, verdicts, read_log_tail(snapshot.run_dir, rank) if rank is not None else None

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if not self.is_running:  # a poll that ends while the app shuts down
            return
        worker = event.worker
        if worker.group == "poll" and event.state in (WorkerState.SUCCESS, WorkerState.ERROR):
            self.polling = False
            self.read_error = f"{worker.error}" if event.state == WorkerState.ERROR else ""
        elif event.state == WorkerState.ERROR:
            self.notify(f"{worker.group}: {worker.error}", severity="error")
        if event.state != WorkerState.SUCCESS:
            return
        if worker.group == "poll":
            snapshot, verdicts, self.log_tail = worker.result
            self.verdicts = verdicts
            self.snapshot = snapshot
        elif worker.group == "py-spy":
            rank, label, lines = worker.result
            self.spy_stacks[rank] = (label, lines)
            self.show_detail()

    # -- showing

    def watch_snapshot(self) -> None:
        self.show()

    def watch_query_text(self) -> None:
        self.show()

    def watch_blocking(self) -> None:
        self.show()

    def watch_read_error(self) -> None:
        self.show()

    def watch_selected_rank(self) -> None:
        self.show_detail()
        self.poll()  # fetch the newly selected rank's log

    def show(self) -> None:
        if self.snapshot is None:
            return
        model = build_grid(self.snapshot, self.verdicts, self.query_text)
        grid = self.query_one(RankGrid)
        grid.model = model
        culprit_named = any(verdict.culprit_ranks for verdict in self.verdicts)
        if (not any(grid.selected in ranks for ranks in model.selectable_rows())
                or culprit_named and not self.culprit_was_named):
            grid.selected = default_selection(model)  # jump to a culprit once it is named
        self.culprit_was_named = culprit_named
        self.query_one(VerdictBar).verdicts = self.verdicts
        status = status_text(self.snapshot, self.controller, self.blocking, self.query_text)
        if self.read_error:
            status += f" · reading the run dir failed: {self.read_error}"
        self.query_one("#status", Static).update(Text(status))
        self.show_detail()

    def on_rank_grid_selected(self, message: RankGrid.Selected) -> None:
        self.selected_rank = message.rank

    def show_detail(self) -> None:
        rank = self.selected_rank
        if self.snapshot is None or rank not in self.snapshot.ranks:
            return
        state = self.snapshot.ranks[rank]
        if rank in self.spy_stacks:
            stack_source, stack = self.spy_stacks[rank]
        elif state.stacks:
            stack_source, stack = "dump", stack_lines(state.stacks)
        else:
            stack_source, stack = "probe", ["main thread", f"  {state.frame}"]
        log = self.log_tail if self.log_tail and self.log_tail.rank == rank else None
        self.query_one(RankDetail).view = RankView(
            state=state,
            word=self.query_one(RankGrid).model.cells[rank].state,
            now=self.snapshot.taken_at,
            stack_source=stack_source,
            stack=stack,
            log_name=log.name if log else None,
            log_tail=log.lines if log else [],
        )

    # -- keys

    def action_focus_detail(self) -> None:
        self.query_one(RankDetail).focus()

    def action_focus_grid(self) -> None:
        self.query_one("#filter", Input).display = False
        self.query_one(RankGrid).focus()

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.value = self.query_text
        box.display = True
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.query_text = event.value.strip()
        self.action_focus_grid()

    def action_py_spy(self, native: bool) -> None:
        rank = self.selected_rank
        if self.snapshot is None or rank is None:
            return
        self.notify(f"py-spy dump{' --native' if native else ''} of rank {rank}…")
        self.spy(rank, self.snapshot.ranks[rank].identity.pid, native)

    @work(thread=True, group="py-spy", exit_on_error=False)
    def spy(self, rank: int, pid: int, native: bool) -> tuple[int, str, list[str]]:
        stacks = self.source.py_spy(pid, native)
        lines = stack_lines(stacks.threads) if stacks.threads else [stacks.note or "py-spy gave nothing"]
        return rank, "py-spy --native" if native else "py-spy", lines

    def action_dump(self) -> None:
        if self.snapshot is not None:
            self.dump()

    @work(thread=True, group="dump", exit_on_error=False)
    def dump(self) -> None:
        missing = self.source.request_dump()
        message = "\n".join(["no stacks from:", *missing]) if missing else "every live rank dumped its stacks"
        self.call_from_thread(self.notify, message, severity="warning" if missing else "information")

    def action_toggle_blocking(self) -> None:
        rank = self.selected_rank
        if self.controller is None:
            self.notify(NO_CONTROLLER, severity="warning")
        elif rank is not None:
            on = self.controller.toggle_launch_blocking(rank)
            self.blocking = self.blocking | {rank} if on else self.blocking - {rank}
            self.notify(f"CUDA_LAUNCH_BLOCKING={int(on)} for rank {rank} at the next restart (r)")

    def action_restart(self) -> None:
        if self.controller is None:
            self.notify(NO_CONTROLLER, severity="warning")
        else:
            self.notify("restarting the command…")
            self.spy_stacks.clear()
            self.run_controller(self.controller.restart)

    @work(thread=True, group="controller", exit_on_error=False)
    def run_controller(self, call) -> None:
        call()

    def action_quit_asking(self) -> None:
        if self.controller is None:
            self.exit()
        else:
            self.push_screen(QuitScreen(), self.quit_with)

    def quit_with(self, choice: str | None) -> None:
        if choice == STOP:
            self.controller.stop()
        if choice is not None:
            self.exit()


def stack_lines(stacks: dict[str, list[str]]) -> list[str]:
    """Thread by thread, outermost frame first, as a traceback reads."""
    return [line for name, frames in stacks.items()
            for line in (f"thread {name}", *(f"  {frame}" for frame in frames))]


def default_selection(model: GridModel) -> int | None:
    """The first culprit on screen, else the first rank on screen."""
    shown = [rank for ranks in model.selectable_rows() for rank in ranks]
    culprits = [rank for rank in shown if model.cells[rank].state == CULPRIT]
    return (culprits or shown or [None])[0]
