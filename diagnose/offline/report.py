"""Verdicts for people (one terminal screen, with rich) and for programs (JSON);
and after --relaunch-on-cuda-error, the two runs' error sites side by side.

The screen: each verdict's sentence, the culprit in red and the ranks that wait
on it in yellow, then one row per rank: where it is and what it last did.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from diagnose.core.snapshot import CollectiveRecord, RankState, Snapshot, Verdict
from diagnose.core.vocab import Mention, RankStatus

CULPRIT_STYLE = "bold red"
VICTIM_STYLE = "yellow"
MENTION_STYLES = {Mention.CULPRIT: CULPRIT_STYLE, Mention.VICTIMS: VICTIM_STYLE}
CUDA_ERROR_FRAMES = 4   # innermost frames shown beside each other for a CUDA error


@dataclass
class RankRow:
    rank: int
    stage: str              # "3/0" (pp rank/tp rank), or "" outside a TP x PP layout
    state: RankStatus
    phase: str | None
    step: int | None
    heartbeat_age_s: float
    last_collective: str    # "tp2 all_reduce #9 waiting", "pp send->6 #4"
    frame: str


def rank_rows(snapshot: Snapshot, verdicts: list[Verdict]) -> list[RankRow]:
    culprits = {rank for verdict in verdicts for rank in verdict.culprit_ranks}
    victims = {rank for verdict in verdicts for rank in verdict.victim_ranks}
    rows = []
    for rank, state in snapshot.ranks.items():
        phase = state.open_phases[-1] if state.open_phases else None
        steps = [event.step for event in state.open_phases + state.phases if event.step is not None]
        rows.append(RankRow(
            rank=rank, stage=_stage(state),
            state=_status(rank, state, culprits, victims),
            phase=phase.name if phase else None, step=max(steps) if steps else None,
            heartbeat_age_s=round(max(0.0, snapshot.taken_at - state.heartbeat_at), 3),
            last_collective=_last_collective(state), frame=state.frame))
    return rows


def _status(rank: int, state: RankState, culprits: set[int], victims: set[int]) -> RankStatus:
    if rank in culprits:
        return RankStatus.CULPRIT
    if not state.alive:
        return RankStatus.EXITED if state.ended_normally else RankStatus.DEAD
    return RankStatus.VICTIM if rank in victims else RankStatus.RUNNING


def to_json(snapshot: Snapshot, verdicts: list[Verdict]) -> dict:
    return {"verdicts": [asdict(verdict) for verdict in verdicts],
            "ranks": [asdict(row) for row in rank_rows(snapshot, verdicts)]}


def renderable(snapshot: Snapshot, verdicts: list[Verdict]) -> Group:
    """One screen: the verdict sentence over a table of every rank."""
    return Group(Panel(_verdict_lines(verdicts), title=f"diag: {snapshot.run_dir}",
                       border_style="red" if verdicts else "green"),
                 _rank_table(rank_rows(snapshot, verdicts)))


def render(snapshot: Snapshot, verdicts: list[Verdict], console: Console | None = None,
           notes: list[str] | None = None) -> None:
    console = console or Console()
    console.print(renderable(snapshot, verdicts))
    for note in notes or []:
        console.print(Text(f"note: {note}", style="dim"))


def _verdict_lines(verdicts: list[Verdict]) -> Group | Text:
    if not verdicts:
        return Text("no hang, death or straggler found", style="green")
    lines = []
    for verdict in verdicts:
        line = Text(f"[{verdict.kind}] ", style="bold")
        lines.append(line + summary_text(verdict, MENTION_STYLES))
    return Group(*lines)


def summary_text(verdict: Verdict, styles: dict[Mention, object]) -> Text:
    """The verdict's sentence, its culprit and the processes waiting on it styled."""
    text = Text(verdict.summary)
    for span in verdict.spans:
        text.stylize(styles[span.mention], span.start, span.end)
    return text


def _rank_table(rows: list[RankRow]) -> Table:
    """One line per rank, cut to the screen's width; columns no rank has a value
    for are left out."""
    cells = [[str(row.rank), row.stage, row.state, row.phase or "",
              "" if row.step is None else str(row.step), f"{row.heartbeat_age_s:.1f}s",
              row.last_collective, row.frame] for row in rows]
    headers = ("rank", "pp/tp", "state", "phase", "step", "hb age", "last collective", "frame")
    shown = [index for index in range(len(headers)) if any(cell[index] for cell in cells)]
    table = Table(show_edge=False, pad_edge=False, expand=True)
    for index in shown:
        flexible = headers[index] == "frame"          # the one column that gives way
        table.add_column(headers[index], no_wrap=True, overflow="ellipsis",
                         ratio=1 if flexible else None)
    styles = {RankStatus.CULPRIT: CULPRIT_STYLE, RankStatus.VICTIM: VICTIM_STYLE,
              RankStatus.DEAD: "red", RankStatus.EXITED: "dim"}
    for row, cell in zip(rows, cells):
        table.add_row(*[cell[index] or "-" for index in shown], style=styles.get(row.state))
    return table


def _stage(state: RankState) -> str:
    ident = state.identity
    if ident.pp_rank is None or ident.tp_rank is None:
        return ""
    return f"{ident.pp_rank}/{ident.tp_rank}"


def _last_collective(state: RankState) -> str:
    if not state.collectives:
        return ""
    record = state.collectives[-1]
    waiting = " waiting" if record.state != "completed" else ""
    return f"{collective_label(record)}{waiting}"


def collective_label(record: CollectiveRecord) -> str:
    """"tp2 all_reduce #9", "pp send->6 #4", "pp recv<-4 #4"."""
    peer = {"send": f"->{record.peer}", "recv": f"<-{record.peer}"}.get(record.op, "")
    return f"{record.group} {record.op}{peer} #{record.seq}"


def cuda_error_table(body: dict) -> Table:
    """--relaunch-on-cuda-error: where the CUDA error surfaced in the first run,
    beside where it was raised with CUDA_LAUNCH_BLOCKING=1 on the rank."""
    first, blocking = body["first_run"], body["launch_blocking_run"]
    kernel = f": kernel {body['kernel']}" if body["kernel"] else ""
    table = Table(title=f"CUDA error on rank {body['rank']}{kernel}", show_edge=False,
                  expand=True, title_style="bold red")
    table.add_column("", style="bold", no_wrap=True)
    table.add_column("first run: where it surfaced", ratio=1)
    table.add_column(f"CUDA_LAUNCH_BLOCKING=1 on rank {body['rank']}: where it was raised",
                     ratio=1)
    for label, key in (("error", "error"), ("call site", "site"), ("code", "code"),
                       ("seen in", "source")):
        table.add_row(label, Text(first[key] or "-"), Text(blocking[key] or "-"))
    table.add_row("stack", Text("\n".join(first["frames"][-CUDA_ERROR_FRAMES:]) or "-"),
                  Text("\n".join(blocking["frames"][-CUDA_ERROR_FRAMES:]) or "-"))
    if body["device_assert"]:
        table.caption = Text(body["device_assert"])
    return table


def render_cuda_error(body: dict, console: Console | None = None) -> None:
    (console or Console(stderr=True)).print(cuda_error_table(body))
