"""The terminal side of `diag launch` and `diag demo` without the TUI (which
diagnose/cli composes with the launcher): a rich live view while the command
runs (when stderr is a terminal) with the command's output above it, or the
output and each verdict once as it appears; and the report at the end."""
from __future__ import annotations

import signal
import sys
from contextlib import contextmanager

from rich.console import Console
from rich.live import Live
from rich.text import Text

from diagnose.core.shown import shown
from diagnose.core.snapshot import Snapshot
from diagnose.launch.launcher import Launcher, Outcome
from diagnose.launch.output import to_stderr
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
            live.update(report.renderable(l.judged.snapshot, list(l.judged.verdicts)))
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
        print_lines(launcher.output.last_lines())


def print_lines(lines: list[str]) -> None:
    for line in lines or ["(it printed nothing)"]:
        print(f"  | {shown(line)}", file=sys.stderr)
