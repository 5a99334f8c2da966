"""The terminal side of `diag launch` and `diag demo`: the TUI, or a rich live
view while the command runs (when stderr is a terminal), or verdict lines as
they appear; and the report at the end."""
from __future__ import annotations

import sys
import threading

from rich.console import Console
from rich.live import Live

from diagnose.launch.launcher import Launcher, Outcome
from diagnose.launch.rundir import LauncherSource
from diagnose.offline import report


def run_with_live_view(launcher: Launcher, console: Console | None = None) -> Outcome:
    console = console or Console(stderr=True)
    if not console.is_terminal:
        return _run_plain(launcher, console)
    launcher.opts.echo_output = False  # the live view owns the terminal
    with Live(console=console, refresh_per_second=4, transient=True) as live:
        def update(l: Launcher) -> None:
            live.update(report.renderable(l.snapshot, l.verdicts))
        return launcher.run(on_update=update)


def _run_plain(launcher: Launcher, console: Console) -> Outcome:
    shown: set[str] = set()

    def update(l: Launcher) -> None:
        for verdict in l.verdicts:
            if verdict.summary not in shown:
                shown.add(verdict.summary)
                console.print(f"diag: {verdict.kind}: {verdict.summary}")
    return launcher.run(on_update=update)


def print_outcome(launcher: Launcher, outcome: Outcome) -> None:
    report.render(launcher.snapshot, outcome.verdicts, notes=launcher.collector.notes)
    print(f"report: {outcome.report_path}", file=sys.stderr)


def run_with_tui(launcher: Launcher, stop_on_exit: bool = False) -> Outcome:
    """The launcher watches in a thread; the TUI shows what it last saw. Quitting
    the TUI either stops the run or leaves it to finish under the plain view."""
    from tui.app import DiagApp

    launcher.opts.echo_output = False
    result: dict[str, Outcome] = {}
    watcher = threading.Thread(target=lambda: result.update(outcome=launcher.run()), daemon=True)
    watcher.start()
    DiagApp(LauncherSource(launcher), controller=TuiController(launcher)).run()
    if stop_on_exit:
        launcher.request_stop()
    launcher.opts.echo_output = True
    watcher.join()
    return result["outcome"]


class TuiController:
    """The TUI's keys b, r and q, carried out by the launcher's watch loop."""

    def __init__(self, launcher: Launcher):
        self.launcher = launcher

    def toggle_launch_blocking(self, rank: int) -> bool:
        return self.launcher.toggle_launch_blocking(rank)

    def restart(self) -> None:
        self.launcher.restart()

    def stop(self) -> None:
        self.launcher.request_stop()
