"""What the rank grid shows, as plain data: the report's rank rows become one cell
per rank laid out by PP stage and TP rank, or, from GROUP_AT ranks on, one line
per group of stages with its ranks counted by state. The state words are the
report's, upper-cased, with a running rank that waits for work called IDLE."""
from __future__ import annotations

from dataclasses import dataclass

from diagnose.core.layout import parse_ranks
from diagnose.core.snapshot import RankState, Snapshot, Verdict
from diagnose.core.vocab import STARTUP_PHASES, Phase, RankStatus
from diagnose.offline.report import RankRow, rank_rows

CULPRIT, DEAD, WAITING, RUNNING, IDLE = "CULPRIT", "DEAD", "WAITING", "RUNNING", "IDLE"
EXITED = "EXITED"   # ended normally
ENDED = "ENDED"     # gone, with no normal end and no death to blame (stopped)
STATES_BY_SEVERITY = (CULPRIT, DEAD, WAITING, RUNNING, IDLE, EXITED, ENDED)
NAMED_STATES = (CULPRIT, DEAD)  # grouped lines list these ranks by number
REPORT_WORDS = {RankStatus.CULPRIT: CULPRIT, RankStatus.DEAD: DEAD, RankStatus.VICTIM: WAITING,
                RankStatus.RUNNING: RUNNING, RankStatus.EXITED: EXITED, RankStatus.ENDED: ENDED}
IDLE_PHASES = (None, Phase.DEQUEUE)  # a running rank here waits for work, not on a peer

GROUP_AT = 64


@dataclass
class RankCell:
    rank: int
    stage: int
    column: int
    state: str
    phase: str | None
    step: int | None
    heartbeat_age: float
    last_collective: str  # "tp3 all_reduce #340 waiting", or "" before the first one
    doing: str = ""       # the rank's recent state sample: "compiling 42 s", "collective"
    starting_for: float | None = None   # seconds in the start-up phase it is in, if it is


@dataclass
class StageRow:
    stage: int
    cells: list[RankCell | None]  # by TP rank; None where the filter hides the rank


@dataclass
class GroupLine:
    first_stage: int
    last_stage: int
    counts: dict[str, int]            # state -> ranks in it, most severe first
    named: dict[str, list[int]]       # NAMED_STATES -> their ranks
    ranks: list[int]                  # most severe first: the order selection walks


@dataclass
class GridModel:
    cells: dict[int, RankCell]        # every rank, filtered or not
    rows: list[StageRow]              # grid mode
    groups: list[GroupLine]           # grouped mode
    grouped: bool
    query: str = ""                   # the filter it was built with

    def selectable_rows(self) -> list[list[int]]:
        """The ranks that up/down and left/right walk over, row by row."""
        if self.grouped:
            return [line.ranks for line in self.groups]
        return [[cell.rank for cell in row.cells if cell] for row in self.rows]


def make_cell(row: RankRow, state: RankState, now: float) -> RankCell:
    word = REPORT_WORDS[row.state]
    ident = state.identity
    return RankCell(
        rank=row.rank,
        stage=ident.pp_rank or 0,
        column=ident.tp_rank if ident.tp_rank is not None else row.rank,
        state=IDLE if word == RUNNING and row.phase in IDLE_PHASES else word,
        phase=row.phase or last_phase(state),
        step=row.step,
        heartbeat_age=max(0.0, row.heartbeat_age_s),
        last_collective=row.last_collective,
        doing=row.doing,
        starting_for=starting_for(state, now),
    )


def starting_for(state: RankState, now: float) -> float | None:
    """How long the rank has been in the start-up phase it is in (loading weights,
    say); None in any other phase."""
    phase = state.phase
    if phase is None or phase.name not in STARTUP_PHASES:
        return None
    return max(0.0, now - phase.start)


def last_phase(state: RankState) -> str | None:
    """'after dequeue' for a rank in no phase now; its end (Phase.EXIT) is no phase
    it was in."""
    names = [event.name for event in state.phases if event.name != Phase.EXIT]
    return f"after {names[-1]}" if names else None


def matcher(query: str):
    """The `/` filter as a test of a cell: rank numbers and ranges ("6", "0-3,6"),
    else a state word or part of a phase name; an empty query lets every cell by."""
    query = query.strip().lower()
    try:
        ranks = parse_ranks(query)
    except ValueError:
        return lambda cell: not query or cell.state.lower() == query or query in (cell.phase or "")
    return lambda cell: cell.rank in ranks


def build_grid(snapshot: Snapshot, verdicts: list[Verdict], query: str = "") -> GridModel:
    cells = {row.rank: make_cell(row, snapshot.ranks[row.rank], snapshot.taken_at)
             for row in rank_rows(snapshot, verdicts)}
    matches = matcher(query)
    shown = [cell for cell in cells.values() if matches(cell)]
    if len(cells) >= GROUP_AT:
        return GridModel(cells, rows=[], groups=group_stages(shown), grouped=True, query=query)
    return GridModel(cells, rows=stage_rows(cells.values(), shown), groups=[], grouped=False,
                     query=query)


def stage_rows(all_cells, shown: list[RankCell]) -> list[StageRow]:
    width = 1 + max((cell.column for cell in all_cells), default=-1)
    rows: dict[int, StageRow] = {}
    for cell in shown:
        row = rows.setdefault(cell.stage, StageRow(cell.stage, [None] * width))
        row.cells[cell.column] = cell
    return [rows[stage] for stage in sorted(rows)]


def group_stages(shown: list[RankCell]) -> list[GroupLine]:
    """One line per stage; neighbouring stages with the same counts and no named
    rank share a line, so a culprit among a thousand ranks stays on screen."""
    by_stage: dict[int, list[RankCell]] = {}
    for cell in shown:
        by_stage.setdefault(cell.stage, []).append(cell)
    lines: list[GroupLine] = []
    for stage in sorted(by_stage):
        line = group_line(stage, by_stage[stage])
        prev = lines[-1] if lines else None
        if (prev and not prev.named and not line.named and prev.counts == line.counts
                and prev.last_stage == stage - 1):
            prev.last_stage = stage
            prev.ranks += line.ranks
        else:
            lines.append(line)
    return lines


def group_line(stage: int, cells: list[RankCell]) -> GroupLine:
    order = {state: i for i, state in enumerate(STATES_BY_SEVERITY)}
    cells = sorted(cells, key=lambda cell: (order[cell.state], cell.rank))
    counts: dict[str, int] = {}
    named: dict[str, list[int]] = {}
    for cell in cells:
        counts[cell.state] = counts.get(cell.state, 0) + 1
        if cell.state in NAMED_STATES:
            named.setdefault(cell.state, []).append(cell.rank)
    return GroupLine(stage, stage, counts, named, [cell.rank for cell in cells])


def default_selection(model: GridModel) -> int | None:
    """The first culprit on screen, else the first death (a dead rank that a
    verdict names first is DEAD, not CULPRIT), else the first rank on screen."""
    shown = [rank for ranks in model.selectable_rows() for rank in ranks]
    for state in NAMED_STATES:
        named = [rank for rank in shown if model.cells[rank].state == state]
        if named:
            return named[0]
    return (shown or [None])[0]


def move(model: GridModel, rank: int | None, dx: int, dy: int) -> int | None:
    """The rank one step left/right (dx) or up/down (dy) from `rank`."""
    rows = [row for row in model.selectable_rows() if row]
    if not rows:
        return None
    where = next(((y, row.index(rank)) for y, row in enumerate(rows) if rank in row), None)
    if where is None:
        return rows[0][0]
    y, x = where
    y = min(max(y + dy, 0), len(rows) - 1)
    x = min(max(x + dx, 0), len(rows[y]) - 1)
    return rows[y][x]
