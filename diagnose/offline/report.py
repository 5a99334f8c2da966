"""Verdicts for people (one terminal screen, with rich) and for programs (JSON);
and after --relaunch-on-cuda-error, the two runs' error sites side by side.

The screen: each verdict's sentence, the culprit in red and the ranks that wait
on it in yellow, then one row per rank: where it is and what it last did.
"""
from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from diagnose.analysis.doing import sampled
from diagnose.analysis.status import rank_status
from diagnose.core.shown import shown
from diagnose.core.snapshot import CollectiveRecord, Crash, RankState, Snapshot, Verdict
from diagnose.core.vocab import Mention, Op, RankStatus
from diagnose.offline.console import fills_screen, output_console

CULPRIT_STYLE = "bold red"
VICTIM_STYLE = "yellow"
MENTION_STYLES = {Mention.CULPRIT: CULPRIT_STYLE, Mention.VICTIMS: VICTIM_STYLE}
CUDA_ERROR_FRAMES = 4   # innermost frames shown beside each other for a CUDA error
SAMPLE_SHOWN_S = 20.0   # a rank's last state sample is shown this long once it is read
                        # (diag launch takes one every 2 to 16 s while the rank stays still)
SCREEN_ROWS = 48        # a longer rank table shows the ranks nearest its culprits
TELLING = (RankStatus.CULPRIT, RankStatus.DEAD)


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
    doing: str = ""         # its last state sample: "compiling 42 s", "collective", ...


def rank_rows(snapshot: Snapshot, verdicts: list[Verdict],
              groups: set[str] | None = None) -> list[RankRow]:
    """One row per rank; with groups, its last collective is its last in them."""
    rows = []
    status = rank_status(verdicts)
    for rank, state in snapshot.ranks.items():
        phase = state.open_phases[-1] if state.open_phases else None
        steps = [event.step for event in state.open_phases + state.phases if event.step is not None]
        rows.append(RankRow(
            rank=rank, stage=_stage(state), state=status(rank, state),
            phase=phase.name if phase else None, step=max(steps) if steps else None,
            heartbeat_age_s=round(max(0.0, snapshot.taken_at - state.heartbeat_at), 3),
            last_collective=_last_collective(state, groups), frame=state.frame,
            doing=_doing(state, snapshot.taken_at)))
    return rows


def _doing(state: RankState, now: float) -> str:
    """What the rank's recent state sample says, where the analysis trusts it: of
    this process, alive, and taken since the rank last made progress. Its age
    counts from when it was read in full: on a starved host the dump alone can
    take most of SAMPLE_SHOWN_S."""
    sample = state.activity
    if not sampled(state) or now - (sample.done_at or sample.taken_at) > SAMPLE_SHOWN_S:
        return ""
    return sample.text(now)


def to_json(snapshot: Snapshot, verdicts: list[Verdict], rows: list[RankRow] | None = None,
            crash: Crash | None = None) -> dict:
    rows = rank_rows(snapshot, verdicts) if rows is None else rows
    # a row is flat: asdict would deep-copy each of its values (0.5 s at 16,384 ranks)
    return {"verdicts": [asdict(verdict) for verdict in verdicts],
            "ranks": [dict(vars(row)) for row in rows],
            "crashed": None if crash is None else asdict(crash)}


def renderable(snapshot: Snapshot, verdicts: list[Verdict], rows: list[RankRow] | None = None,
               expand: bool = True, crash: Crash | None = None) -> Group:
    """One screen: the verdict sentence over a table of every rank (or of `rows`).
    expand: fill the console's width; else keep to the content, cutting nothing."""
    rows = rank_rows(snapshot, verdicts) if rows is None else rows
    return Group(Panel(_verdict_lines(snapshot, verdicts, crash), title=f"diag: {snapshot.run_dir}",
                       border_style="red" if verdicts or crash else "green", expand=expand),
                 _rank_table(rows, expand))


def render(snapshot: Snapshot, verdicts: list[Verdict], console: Console | None = None,
           notes: list[str] | None = None, rows: list[RankRow] | None = None,
           caption: str | None = None, crash: Crash | None = None) -> None:
    """The screen on a terminal; to a pipe or a file, every field whole. A job of
    more ranks than a screen holds shows SCREEN_ROWS of them (JSON has them all)."""
    console = console or output_console()
    rows = rank_rows(snapshot, verdicts) if rows is None else rows
    if len(rows) > SCREEN_ROWS:
        caption = "; ".join(filter(None, [caption, f"showing {SCREEN_ROWS} of {len(rows)} "
                                          f"ranks, the culprits' nearest first (--ranks to "
                                          f"choose, --json for every rank)"]))
        rows = screenful(rows)
    console.print(renderable(snapshot, verdicts, rows, expand=fills_screen(console), crash=crash))
    if caption:
        console.print(Text(shown(caption), style="dim"))
    for note in notes or []:
        console.print(Text(f"note: {shown(note)}", style="dim"))


def screenful(rows: list[RankRow]) -> list[RankRow]:
    """SCREEN_ROWS rows in rank order: the culprits and the dead, then the ranks
    nearest to one of them (their TP peers and pipeline neighbours)."""
    telling = sorted(row.rank for row in rows if row.state in TELLING)

    def distance(row: RankRow) -> int:
        if not telling:
            return row.rank
        at = bisect.bisect_left(telling, row.rank)
        return min(abs(row.rank - telling[i]) for i in (at - 1, at) if 0 <= i < len(telling))
    chosen = sorted(rows, key=lambda row: (distance(row), row.rank))[:SCREEN_ROWS]
    return sorted(chosen, key=lambda row: row.rank)


def _verdict_lines(snapshot: Snapshot, verdicts: list[Verdict],
                   crash: Crash | None = None) -> Group | Text:
    if crash is not None and not verdicts:
        return Text(f"[crashed] the job ended after a rank failed; the first failure: "
                    f"{crash.summary}", style="bold red")
    if not verdicts and not any(state.phases or state.collectives
                                for state in snapshot.ranks.values()):
        return Text("no verdict: no rank recorded a phase or a collective to judge by",
                    style="yellow")
    if not verdicts:
        return Text("no hang, death or straggler found", style="green")
    lines = []
    for verdict in verdicts:
        line = Text(f"[{verdict.kind}] ", style="bold")
        lines.append(line + summary_text(verdict, MENTION_STYLES))
    return Group(*lines)


def summary_text(verdict: Verdict, styles: dict[Mention, object]) -> Text:
    """The verdict's sentence, its culprit and the processes waiting on it
    styled; what it quotes of the ranks' files is escaped piece by piece, so
    that the styles stay on their words."""
    summary, text, at = verdict.summary, Text(), 0
    for span in sorted(verdict.spans, key=lambda span: span.start):
        if span.start < at:
            continue
        text.append(shown(summary[at:span.start]))
        text.append(shown(summary[span.start:span.end]), style=styles[span.mention])
        at = span.end
    return text.append(shown(summary[at:]))


def _rank_table(rows: list[RankRow], expand: bool) -> Table:
    """One line per rank; columns no rank has a value for are left out. Filling
    the screen, the frame column gives way to the others, cut to `…`."""
    cells = [[str(row.rank), row.stage, row.state, shown(row.phase or ""),
              "" if row.step is None else str(row.step), f"{row.heartbeat_age_s:.1f}s",
              shown(row.doing), shown(row.last_collective), shown(row.frame)] for row in rows]
    headers = ("rank", "pp/tp", "state", "phase", "step", "hb age", "doing", "last collective",
               "frame")
    columns = [index for index in range(len(headers)) if any(cell[index] for cell in cells)]
    table = Table(show_edge=False, pad_edge=False, expand=expand)
    for index in columns:
        flexible = expand and headers[index] == "frame"
        table.add_column(headers[index], no_wrap=True, overflow="ellipsis",
                         ratio=1 if flexible else None)
    styles = {RankStatus.CULPRIT: CULPRIT_STYLE, RankStatus.VICTIM: VICTIM_STYLE,
              RankStatus.DEAD: "red", RankStatus.EXITED: "dim", RankStatus.ENDED: "dim"}
    for row, cell in zip(rows, cells):
        table.add_row(*[Text(cell[index] or "-") for index in columns],
                      style=styles.get(row.state))
    return table


def _stage(state: RankState) -> str:
    ident = state.identity
    if ident.pp_rank is None or ident.tp_rank is None:
        return ""
    return f"{ident.pp_rank}/{ident.tp_rank}"


def _last_collective(state: RankState, groups: set[str] | None) -> str:
    records = state.collectives if groups is None else [
        record for record in state.collectives if record.group in groups]
    if not records:
        return ""
    record = records[-1]
    waiting = " waiting" if record.state != "completed" else ""
    return f"{collective_label(record)}{waiting}"


def collective_label(record: CollectiveRecord) -> str:
    """"tp2 all_reduce #9", "pp send->6 #4", "pp recv<-4 #4"."""
    arrow = "->" if record.op == Op.SEND else "<-" if record.op == Op.RECV else None
    peer = f"{arrow}{record.peer}" if arrow else ""
    return f"{record.group} {str(record.op)}{peer} #{record.seq}"


def cuda_error_table(body: dict, expand: bool = True) -> Table:
    """--relaunch-on-cuda-error: where the CUDA error surfaced in the first run,
    beside where it was raised with CUDA_LAUNCH_BLOCKING=1 on the rank."""
    first, blocking = body["first_run"], body["launch_blocking_run"]
    kernel = f": kernel {shown(body['kernel'])}" if body["kernel"] else ""
    table = Table(title=Text(f"CUDA error on rank {body['rank']}{kernel}"), show_edge=False,
                  expand=expand, title_style="bold red")
    table.add_column("", style="bold", no_wrap=True)
    table.add_column("first run: where it surfaced", ratio=1)
    table.add_column(f"CUDA_LAUNCH_BLOCKING=1 on rank {body['rank']}: where it was raised",
                     ratio=1)
    for label, key in (("error", "error"), ("call site", "site"), ("code", "code"),
                       ("seen in", "source")):
        table.add_row(label, Text(shown(first[key] or "-")), Text(shown(blocking[key] or "-")))
    table.add_row("stack", Text(_frames(first) or "-"), Text(_frames(blocking) or "-"))
    if body["device_assert"]:
        table.caption = Text(shown(body["device_assert"]))
    return table


def _frames(run: dict) -> str:
    return "\n".join(shown(frame) for frame in run["frames"][-CUDA_ERROR_FRAMES:])


def render_cuda_error(body: dict, console: Console | None = None) -> None:
    console = console or output_console(stderr=True)
    console.print(cuda_error_table(body, expand=fills_screen(console)))
