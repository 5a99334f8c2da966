"""The TUI: polls a source of snapshots from a worker thread, several times a second,
and shows the verdict, the rank grid and the selected rank's evidence. Nothing here
waits on a rank: the source reads files, and a slow read only delays the next frame."""
from __future__ import annotations

import time
from typing import Protocol

from rich.text import Text
from textual import events, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.reactive import reactive
from textual.widgets import Input, Static
from textual.worker import Worker, WorkerState

from diagnose.core.output import addresses
from diagnose.core.shown import shown
from diagnose.core.snapshot import Judged, Snapshot, Verdict
from tui.grid_model import GridModel, build_grid, default_selection
from tui.help_screen import HELP_KEYS, HelpScreen
from tui.key_footer import KeyFooter
from tui.log_files import LogTail, read_log_tail, read_output_tail
from tui.output_pane import OutputPane
from tui.quit_screen import STOP, QuitScreen
from tui.rank_detail import RankDetail, RankView, stack_lines
from tui.rank_grid import RankGrid
from tui.status import as_shown, no_ranks_text, status_text
from tui.verdict_bar import VerdictBar

POLL_INTERVAL_S = 0.25
TYPING_REST_S = 1.0     # the timer's reads wait this long after a key (the keys come first)
SMALL_HEIGHT = 40       # rows: below it the output pane takes less, the culprit's stack more
QUIT_HELP = "quit; while diag launch runs the job, first asks: stop it, or leave it running?"


class Source(Protocol):
    """What the TUI shows and the two things it may ask of the ranks
    (diagnose.launch.rundir has the run dir's and the launcher's)."""
    def judged(self) -> Judged: ...     # a snapshot and its verdicts, as one
    def launcher_judgment(self): ...    # diag launch's latest verdicts, or None
    def request_dump(self) -> list[str]: ...
    def py_spy(self, pid: int, native: bool): ...
    def command(self) -> list[str] | None: ...
    live: bool      # its ranks may still run (not dumps read once)
    run_dir: str


class Controller(Protocol):
    """What `diag launch` hands the TUI to act on the job it runs."""
    def toggle_launch_blocking(self, rank: int) -> bool: ...  # the rank's new setting
    def restart(self) -> None: ...
    def stop(self) -> None: ...


class DiagApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "diag"
    ENABLE_COMMAND_PALETTE = False  # its "quit" would not ask about the job
    BINDINGS = [
        Binding(HELP_KEYS, "help", "Help", tooltip="this list of keys"),
        Binding("enter", "detail", "Detail",
                tooltip="the selected rank's detail (stack, phases, collectives, log) on the "
                        "whole width, and back"),
        Binding("escape", "focus_grid", "Grid", show=False,
                tooltip="back to the grid (and away from the filter)"),
        Binding("s", "py_spy(False)", "py-spy", tooltip="py-spy dump of the selected rank's stacks"),
        Binding("n", "py_spy(True)", "native", tooltip="py-spy dump --native: with C/C++ frames"),
        Binding("d", "dump", "Dump all", tooltip="every live rank writes its stacks"),
        Binding("b", "toggle_blocking", "Launch-blocking",
                tooltip="CUDA_LAUNCH_BLOCKING=1 on the selected rank from the next restart"),
        Binding("r", "restart", "Restart", tooltip="end the command's job and run it again"),
        Binding("o", "toggle_output", "Output", tooltip="show or hide the command's output"),
        Binding("slash", "filter", "Filter",
                tooltip="show only some ranks (6, or 0-3,6), a state (waiting, exited, ...) or a phase"),
        Binding("q", "quit_asking", "Quit", tooltip=QUIT_HELP),
        Binding("ctrl+q", "quit_asking", "Quit", show=False, priority=True, tooltip=QUIT_HELP),
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
        self.poll_began = 0.0    # time.monotonic() of the last read's start
        self.rest_until = 0.0    # the timer's next read waits until then
        self.typed_at = -TYPING_REST_S   # time.monotonic() of the last key
        self.log_tail: LogTail | None = None
        self.servers: list[str] = []     # the addresses the command's output announced
        self.spy_stacks: dict[int, tuple[str, list[str]]] = {}
        self.culprit_was_named = False
        self.started_at = time.time()
        self.command = source.command()
        self.acting: tuple | None = None   # what decided the keys offered last
        self.launchers = None      # diag launch's judgment (judged.json), while newer than ours
        self.made: tuple[Snapshot, GridModel] | None = None   # the grid of a snapshot, and its filter

    def notify(self, message: str, **options) -> None:
        """Every notification: what it quotes of the run's files is escaped, and
        none of it is read as markup."""
        super().notify(shown(message, lines=True), **options | {"markup": False})

    def compose(self) -> ComposeResult:
        yield VerdictBar(id="verdict")
        yield Static(id="status")
        with Horizontal(id="main"):
            with VerticalScroll(id="grid-scroll"):
                yield RankGrid(id="grid")
            yield RankDetail(id="detail")
        yield OutputPane(id="output")
        yield Input(placeholder="filter by ranks (6, or 0-3,6), state (waiting, culprit, ...) or phase; "
                                "empty clears", id="filter")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.query_one(RankGrid).focus()
        self.query_one(RankGrid).no_ranks = no_ranks_text(
            Snapshot(time.time(), self.source.run_dir, {}), self.started_at, self.command)
        self.read_launcher_judgment()
        self.poll()
        self.set_interval(POLL_INTERVAL_S, self.poll_due)

    def on_resize(self) -> None:
        self.set_class(self.size.height < SMALL_HEIGHT, "-small")

    # -- reading the source, off the UI thread

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, events.Key) and not event.is_forwarded:
            self.typed_at = time.monotonic()
        await super().on_event(event)

    def poll_due(self) -> None:
        """The timer's read: after a slow one the keys get as long as it took before
        the next (a head's run dir of 16,384 ranks takes a second to judge, and the
        reading thread holds the interpreter while it does), and while keys come,
        none: a read of 1,024 ranks holds it a tenth of a second (docs/performance.md,
        "diag tui's keys")."""
        now = time.monotonic()
        if now >= self.rest_until and now - self.typed_at >= TYPING_REST_S:
            self.poll()

    def poll(self) -> None:
        if not self.polling:
            self.polling = True
            self.poll_began = time.monotonic()
            self.read_source(self.selected_rank, self.query_text)

    @work(thread=True, group="launcher", exit_on_error=False)
    def read_launcher_judgment(self):
        """What diag launch concluded last, shown before this view's first read is
        judged (at 16,384 ranks that takes seconds), and while its judgment is on
        older ranks than the launcher's (a head writes its node files every 10 s)."""
        return self.source.launcher_judgment()

    @work(thread=True, group="poll", exit_on_error=False)
    def read_source(self, rank: int | None, query: str) -> tuple:
        """(snapshot, its verdicts, diag launch's judgment where newer, the selected
        rank's log, the command's output, its grid under the filter `query`). The
        grid is made here too: at 16,384 ranks it takes a quarter of a second, which
        on the UI thread a key would wait for."""
        judged = self.source.judged()
        snapshot, verdicts = as_shown(judged.snapshot), list(judged.verdicts)
        launchers = self.source.launcher_judgment()
        if launchers is not None and launchers.taken_at <= judged.snapshot.taken_at:
            launchers = None                # this view's own judgment is as new
        log = read_log_tail(snapshot.run_dir, rank) if rank is not None else None
        return (snapshot, verdicts, launchers, log, read_output_tail(snapshot.run_dir),
                build_grid(snapshot, verdicts, query))

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if not self.is_running:  # a poll that ends while the app shuts down
            return
        worker = event.worker
        if worker.group == "poll" and event.state in (WorkerState.SUCCESS, WorkerState.ERROR):
            self.polling = False
            self.rest_until = 2 * time.monotonic() - self.poll_began
            self.read_error = f"{worker.error}" if event.state == WorkerState.ERROR else ""
        elif event.state == WorkerState.ERROR:
            self.notify(f"{worker.group}: {worker.error}", severity="error")
        if event.state != WorkerState.SUCCESS:
            return
        if worker.group == "poll":
            snapshot, verdicts, self.launchers, self.log_tail, output, grid = worker.result
            self.made = (snapshot, grid)
            self.servers = addresses(output.lines, self.servers)
            self.query_one(OutputPane).tail = output
            self.verdicts = verdicts
            self.snapshot = snapshot
        elif worker.group == "launcher" and self.snapshot is None:
            self.launchers = worker.result
            self.show_verdict()
        elif worker.group == "log":
            self.log_tail = worker.result
            self.show_detail()
        elif worker.group == "py-spy":
            rank, label, lines = worker.result
            self.spy_stacks[rank] = (label, lines)
            self.show_detail()

    # -- showing

    def watch_snapshot(self) -> None:
        self.show()
        acting = (self.job_over, self.query_one(OutputPane).has_lines)
        if acting != self.acting:   # the footer is built again only when its keys change
            self.acting = acting
            self.refresh_bindings()

    def watch_query_text(self) -> None:
        self.show()

    def watch_blocking(self) -> None:
        self.show()

    def watch_read_error(self) -> None:
        self.show()

    def watch_selected_rank(self, rank: int | None) -> None:
        self.show_detail()
        if rank is not None:
            self.read_log(rank)

    @work(thread=True, group="log", exclusive=True, exit_on_error=False)
    def read_log(self, rank: int) -> LogTail:
        """The newly selected rank's log, without a whole read of the source."""
        return read_log_tail(self.source.run_dir, rank)

    def show(self) -> None:
        if self.snapshot is None:
            return
        model = self.grid_model()
        grid = self.query_one(RankGrid)
        grid.no_ranks = no_ranks_text(self.snapshot, self.started_at, self.command)
        grid.model = model
        culprit_named = any(verdict.culprit_ranks for verdict in self.verdicts)
        if (not any(grid.selected in ranks for ranks in model.selectable_rows())
                or culprit_named and not self.culprit_was_named):
            grid.selected = default_selection(model)  # jump to a culprit once it is named
        self.culprit_was_named = culprit_named
        self.show_verdict()
        status = status_text(self.snapshot, self.blocking, self.query_text, self.servers,
                             read_only=self.controller is None)
        if self.read_error:
            status += f" · reading the run dir failed: {self.read_error}"
        self.query_one("#status", Static).update(Text(shown(status)))
        self.show_detail()

    def grid_model(self) -> GridModel:
        """The grid of this snapshot under this filter: the poll's, where it made
        that one, else made here."""
        made = self.made
        if made is None or made[0] is not self.snapshot or made[1].query != self.query_text:
            made = self.made = (self.snapshot, build_grid(self.snapshot, self.verdicts,
                                                          self.query_text))
        return made[1]

    def show_verdict(self) -> None:
        """This view's verdicts, or diag launch's where they were made on newer ranks."""
        bar, launchers, snapshot = self.query_one(VerdictBar), self.launchers, self.snapshot
        if launchers is not None:
            bar.show_launchers(launchers.verdicts, launchers.taken_at,
                               None if snapshot is None else snapshot.taken_at)
        else:
            bar.said_by, bar.verdicts = "", self.verdicts

    @property
    def job_over(self) -> bool:
        return self.snapshot is not None and self.snapshot.command_exit is not None

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

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen([("the grid", RankGrid.BINDINGS), ("everywhere", self.BINDINGS),
                                         ("asked on quit", QuitScreen.BINDINGS)]))

    def action_toggle_output(self) -> None:
        pane = self.query_one(OutputPane)
        pane.hidden = not pane.hidden

    def action_detail(self) -> None:
        main = self.query_one("#main")
        if main.has_class("-detail"):
            self.action_focus_grid()
        else:
            main.add_class("-detail")
            self.query_one(RankDetail).focus()

    def action_focus_grid(self) -> None:
        self.query_one("#main").remove_class("-detail")
        self.query_one("#filter", Input).display = False
        self.query_one(RankGrid).focus()

    def check_action(self, action: str, parameters: tuple) -> bool:
        """Only the keys that can act are offered (the footer shows no others)."""
        if action in ("toggle_blocking", "restart"):
            return self.controller is not None and not self.job_over
        if action in ("py_spy", "dump"):
            return self.source.live and not self.job_over
        if action == "toggle_output":
            return self.query_one(OutputPane).has_lines
        return True

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
        if rank is not None:
            on = self.controller.toggle_launch_blocking(rank)
            self.blocking = self.blocking | {rank} if on else self.blocking - {rank}
            self.notify(f"CUDA_LAUNCH_BLOCKING={int(on)} for rank {rank} at the next restart (r)")

    def action_restart(self) -> None:
        self.notify("restarting the command…")
        self.spy_stacks.clear()
        self.run_controller(self.controller.restart)

    @work(thread=True, group="controller", exit_on_error=False)
    def run_controller(self, call) -> None:
        call()

    def action_quit_asking(self) -> None:
        if self.controller is None or self.job_over:
            self.exit()
        elif not isinstance(self.screen, QuitScreen):
            self.push_screen(QuitScreen(), self.quit_with)

    def quit_with(self, choice: str | None) -> None:
        if choice == STOP:
            self.controller.stop()
        if choice is not None:
            self.exit()
