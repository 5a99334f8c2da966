"""`diag launch --tui` and `diag demo`'s TUI: the launcher watches in a thread
while the TUI shows what it last saw. Composed here, at the top floor: the
launcher's room knows nothing of the TUI."""
from __future__ import annotations

import shlex
import sys
import threading

from diagnose.core.shown import shown
from diagnose.launch.launcher import Launcher, Outcome
from diagnose.launch.live import nothing_probed, print_lines, stopping_on_signals
from diagnose.launch.output import to_stderr
from diagnose.launch.rundir import LauncherSource


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
        print_lines(launcher.output.last_lines())
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
