"""The terminal side of `diag launch` and `diag demo`: the TUI, or a rich live
view while the command runs (when stderr is a terminal) with the command's
output above it, or the output and each verdict once as it appears; and the
report at the end."""
from __future__ import annotations

import shlex
import signal
import sys
import threading
from contextlib import contextmanager

from rich.console import Console
from rich.live import Live
from rich.text import Text

from diagnose.core.shown import shown
from diagnose.core.shown import shown
from diagnose.core.snapshot import Snapshot
from diagnose.launch.launcher import Launcher, Outcome
from diagnose.launch.output import to_stderr
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
        return _run_plain(launcher)
    with Live(console=console, refresh_per_second=4, transient=True) as live, \
            stopping_on_signals(launcher):
        launcher.output.echo = _above(live)

        def update(l: Launcher) -> None:
            live.update(report.renderable(l.snapshot, l.verdicts))
        try:
            return launcher.run(on_update=update)
        finally:
            launcher.output.echo = to_stderr


def _above(live: Live):
    """The command's lines, printed above the live view (which keeps the bottom
    of the terminal), their colours kept."""
    def echo(line: bytes) -> None:
        live.console.print(Text.from_ansi(line.decode(errors="replace").rstrip("\r\n")))
    return echo


def _run_plain(launcher: Launcher) -> Outcome:
    """Each verdict once, when it appears (the launcher says it)."""
    launcher.echo_verdicts = True
    with stopping_on_signals(launcher):
        return launcher.run()


def print_outcome(launcher: Launcher, outcome: Outcome) -> None:
    if nothing_probed(launcher.snapshot):
        _print_unprobed_end(launcher)
    else:
        report.render(launcher.snapshot, outcome.verdicts, notes=launcher.notes,
                      crash=launcher.crash)
        print(f"diag: {command_ended(launcher)}", file=sys.stderr)
    print(f"report: {outcome.report_path}", file=sys.stderr)


def command_ended(launcher: Launcher) -> str:
    """The command's own exit code, which is never diag's, in one line."""
    ended = _ended(launcher.proc.returncode)
    if launcher.stopped_by is None:
        return f"the command {ended}"
    return (f"stopped by {launcher.stopped_by}: the command's processes were ended "
            f"(the command then {ended})")


def _ended(code: int) -> str:
    return f"was ended by signal {-code}" if code < 0 else f"exited {code}"


def nothing_probed(snapshot: Snapshot) -> bool:
    """No process of the command started the probe: no rank, no driver."""
    return not snapshot.ranks and snapshot.driver is None


def _print_unprobed_end(launcher: Launcher) -> None:
    """A command that ends before any rank or driver started has nothing for the
    analysis to judge; a failure then is the command's own, at start-up."""
    code = launcher.proc.returncode
    ended = _ended(code)
    where = f"no probe file in {launcher.opts.run_dir}"
    if launcher.stopped_by is not None:
        print(f"diag: the command was stopped before any rank or driver started ({where})",
              file=sys.stderr)
    elif code == 0:
        print(f"diag: the command exited 0, and no process of it started the probe ({where}): "
              f"nothing to judge", file=sys.stderr)
    else:
        print(f"diag: the command failed at start-up: it {ended} before any rank or driver "
              f"started ({where}); its last lines:", file=sys.stderr)
        _print_lines(launcher.output.last_lines())


def _print_lines(lines: list[str]) -> None:
    for line in lines or ["(it printed nothing)"]:
        print(f"  | {shown(line)}", file=sys.stderr)


def run_with_tui(launcher: Launcher, stop_on_exit: bool = False) -> Outcome:
    """The launcher watches in a thread; the TUI shows what it last saw. Quitting
    the TUI either stops the run or leaves it to finish under the plain view. The
    job starts first, and a line says so while the TUI loads (a second or more)."""
    launcher.output.echo = None
    result: dict[str, Outcome | Exception] = {}

    def watch() -> None:
        try:
            result["outcome"] = launcher.run()
        except Exception as error:     # raised here once the TUI has closed
            result["error"] = error

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    print(f"diag: running {shlex.join(launcher.opts.command)}; opening the TUI on "
          f"{launcher.opts.run_dir}…", file=sys.stderr, flush=True)
    from tui.app import DiagApp
    app = DiagApp(LauncherSource(launcher), controller=TuiController(launcher))
    with stopping_on_signals(launcher, then=app.exit):
        app.run()
        if stop_on_exit:
            launcher.request_stop()
        _print_after_tui(launcher)
        launcher.output.echo = to_stderr    # what the command prints from now on
        watcher.join()
    if "error" in result:
        raise result["error"]
    return result["outcome"]


def _print_after_tui(launcher: Launcher) -> None:
    """What the TUI showed of the command's own output, now that the terminal is
    the shell's again: its last lines, and where its server listens if it runs on."""
    if launcher.proc is None:
        return
    running = launcher.proc.poll() is None
    if not running and launcher.snapshot is not None and nothing_probed(launcher.snapshot):
        return  # print_outcome says how it ended, with these lines
    if launcher.output.last_lines():
        print(f"diag: the command's last lines (all of its output: {launcher.output.path}):",
              file=sys.stderr)
        _print_lines(launcher.output.last_lines())
    if launcher.output.servers and running and not launcher.stopping:
        print(f"diag: the command runs on; its server: "
              f"{shown(', '.join(launcher.output.servers))}",
              file=sys.stderr)


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
