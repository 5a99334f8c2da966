"""The terminal side of `diag launch` and `diag demo`: the TUI, or a rich live
view while the command runs (when stderr is a terminal), or verdict lines as
they appear; and the report at the end."""
from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager

from rich.console import Console
from rich.live import Live

from diagnose.launch.launcher import Launcher, Outcome
from diagnose.launch.rundir import LauncherSource
from diagnose.offline import report


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def stopping_on_signals(launcher: Launcher, then=lambda: None):
    """SIGINT (Ctrl-C), SIGTERM or SIGHUP stop the run as the TUI's stop does: the
    command's job is ended, the report and the stop written, and the launcher
    exits with 128 + the signal's number. `then` runs after each request."""
    def stop(signum, frame):
        launcher.request_stop(128 + signum, by=signal.Signals(signum).name)
        then()
    previous = {signum: signal.signal(signum, stop) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run_with_live_view(launcher: Launcher, console: Console | None = None) -> Outcome:
    console = console or Console(stderr=True)
    if not console.is_terminal:
        return _run_plain(launcher, console)
    launcher.opts.echo_output = False  # the live view owns the terminal
    with Live(console=console, refresh_per_second=4, transient=True) as live, \
            stopping_on_signals(launcher):
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
    with stopping_on_signals(launcher):
        return launcher.run(on_update=update)


def print_outcome(launcher: Launcher, outcome: Outcome) -> None:
    report.render(launcher.snapshot, outcome.verdicts, notes=launcher.notes)
    print(f"report: {outcome.report_path}", file=sys.stderr)
    if launcher.stopped_by not in (None, "hang"):
        print(f"diag: stopped by {launcher.stopped_by}: the command's processes were ended",
              file=sys.stderr)


def run_with_tui(launcher: Launcher, stop_on_exit: bool = False) -> Outcome:
    """The launcher watches in a thread; the TUI shows what it last saw. Quitting
    the TUI either stops the run or leaves it to finish under the plain view."""
    from tui.app import DiagApp

    launcher.opts.echo_output = False
    result: dict[str, Outcome | Exception] = {}

    def watch() -> None:
        try:
            result["outcome"] = launcher.run()
        except Exception as error:     # raised here once the TUI has closed
            result["error"] = error

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    app = DiagApp(LauncherSource(launcher), controller=TuiController(launcher))
    with stopping_on_signals(launcher, then=app.exit):
        app.run()
        if stop_on_exit:
            launcher.request_stop()
        launcher.opts.echo_output = True
        watcher.join()
    if "error" in result:
        raise result["error"]
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
