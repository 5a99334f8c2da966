"""diag attach on the screen: what it found under the pid, the verdicts and the
rank table (the same report as every command's), then each process's stack
as the last sample saw it, innermost frames last, and whether it moved.
Everything a process wrote about itself (titles, frames) goes through
core.shown."""
from __future__ import annotations

from rich.console import Console
from rich.text import Text

from diagnose.analysis.activity import classify
from diagnose.attach.run import Attached, moving_ranks
from diagnose.core.frames import is_native
from diagnose.core.shown import shown
from diagnose.launch.dump import NATIVE_STYLE
from diagnose.offline import report
from diagnose.offline.console import output_console

SHOWN_FRAMES = 8
FRAME_CHARS = 160       # a C++ template's name runs to thousands; the JSON keeps it whole
HEALTHY = "no hang: ranks progressing"
QUIET = "no hang found: no rank waits on another"


def render_attached(attached: Attached, run_dir: str, console: Console | None = None) -> None:
    console = console or output_console(highlight=False)
    console.print(found_line(attached))
    report.render(attached.snapshot, attached.verdicts, console, notes=attached.notes)
    if not attached.verdicts:
        console.print(Text(HEALTHY if moving_ranks(attached) else QUIET, style="green"))
    culprits = {rank for verdict in attached.verdicts for rank in verdict.culprit_ranks}
    for name in attached.samples:
        console.print(_stack(attached, name, name.isdigit() and int(name) in culprits))
    console.print(Text(f"run dir: {shown(run_dir)} (diag analyze / diag tui open it); "
                       f"{attached.took_s:.1f} s from the call", style="dim"))


def found_line(attached: Attached) -> Text:
    job = attached.job
    shape = (f"tp {job.layout.tp_size} x pp {job.layout.pp_size}" if job.layout
             else f"world size {job.world_size}")
    text = Text(f"diag attach: pid {job.root.pid} ")
    text.append(f"({shown(job.root.title[:80])})", style="dim")
    text.append(f": {job.kind}, {shape}, {len(job.ranks)} ranks found")
    if job.driver is not None:
        text.append(f"; driver pid {job.driver.pid}")
    if job.api_server is not None:
        text.append(f"; API server pid {job.api_server.pid}")
    return text


def _stack(attached: Attached, name: str, culprit: bool) -> Text:
    state = (attached.snapshot.driver if name == "driver"
             else attached.snapshot.ranks.get(int(name)))
    title = "the driver" if name == "driver" else state.identity.name if state else f"rank {name}"
    sample = attached.samples[name].last_sample
    frames = sample.main_frames if sample else []
    doing = classify(frames)
    text = Text(f"{title}", style="bold red" if culprit else "bold")
    text.append(f"  pid {state.identity.pid if state else '?'}, "
                f"{'moving' if attached.samples[name].moved() else 'not moving'}, "
                f"{doing.activity}{f' ({doing.rule})' if doing.rule else ''}\n", style="dim")
    if not frames:
        text.append("    no stack (see the notes)\n", style="dim")
    for frame in frames[-SHOWN_FRAMES:]:
        cut = frame if len(frame) <= FRAME_CHARS else frame[:FRAME_CHARS - 3] + "..."
        text.append(f"    {shown(cut)}\n", style=NATIVE_STYLE if is_native(frame) else None)
    return text
