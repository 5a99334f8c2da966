"""The terminal side of `diag launch` and `diag demo`: a rich live view while the
command runs (when stderr is a terminal), verdict lines as they appear
otherwise, and the report at the end."""
from __future__ import annotations

import sys

from rich.console import Console
from rich.live import Live

from diagnose import report
from diagnose.launch import Launcher, Outcome


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
