"""The ranks at a glance: one row per PP stage, one column per TP rank, each cell
coloured by state and saying it in a word; from GROUP_AT ranks on, one line per
group of stages. The arrow keys move the selection."""
from __future__ import annotations

from rich import box
from rich.console import RenderableType
from rich.table import Table
from rich.text import Text
from textual.binding import Binding
from textual.geometry import Region
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget

from diagnose.core.shown import shown
from tui.grid_model import NAMED_STATES, GridModel, GroupLine, RankCell, StageRow, move

CELL_LINES = 4
MOVE_HELP = "select another rank: up and down a stage, left and right a TP rank"
MAX_NAMED = 6  # ranks listed by number per state on a grouped line


def ranks_label(ranks: list[int]) -> str:
    shown = ", ".join(str(rank) for rank in ranks[:MAX_NAMED])
    more = f", +{len(ranks) - MAX_NAMED}" if len(ranks) > MAX_NAMED else ""
    return f"rank{'s' if len(ranks) > 1 else ''} {shown}{more}"


def cell_lines(cell: RankCell, selected: bool) -> list[str]:
    step = f" · step {cell.step}" if cell.step is not None else ""
    if cell.starting_for is not None:
        step += f" · {cell.starting_for:.0f} s"
    return [
        f"{'▸' if selected else ' '}rank {cell.rank}  {cell.state}",
        f" {cell.phase or 'no phase yet'}{step}",
        f" {cell.last_collective or 'no collective yet'}",
        f" {cell.doing + ', ' if cell.doing else ''}heartbeat {cell.heartbeat_age:.1f}s ago",
    ]


class RankGrid(Widget, can_focus=True):
    # No h/j/k/l: htop's users know h as help and k as kill.
    BINDINGS = [
        Binding("up", "move(0, -1)", "Up", show=False, tooltip=MOVE_HELP),
        Binding("down", "move(0, 1)", "Down", show=False, tooltip=MOVE_HELP),
        Binding("left", "move(-1, 0)", "Left", show=False, tooltip=MOVE_HELP),
        Binding("right", "move(1, 0)", "Right", show=False, tooltip=MOVE_HELP),
    ]
    COMPONENT_CLASSES = {
        "rank-grid--culprit", "rank-grid--dead", "rank-grid--waiting", "rank-grid--running",
        "rank-grid--idle", "rank-grid--exited", "rank-grid--ended", "rank-grid--selected",
        "rank-grid--stage",
    }

    model: reactive[GridModel | None] = reactive(None, layout=True)  # its height follows the ranks
    selected: reactive[int | None] = reactive(None)
    no_ranks: reactive[str] = reactive("")   # what it says while the job has no rank

    class Selected(Message):
        def __init__(self, rank: int | None) -> None:
            super().__init__()
            self.rank = rank

    def action_move(self, dx: int, dy: int) -> None:
        if self.model:
            self.selected = move(self.model, self.selected, dx, dy)

    def watch_selected(self, rank: int | None) -> None:
        self.post_message(self.Selected(rank))
        self.call_after_refresh(self.scroll_to_selected)

    def state_style(self, state: str, selected: bool = False):
        style = self.get_component_rich_style(f"rank-grid--{state.lower()}")
        return style + self.get_component_rich_style("rank-grid--selected", partial=True) if selected else style

    def render(self) -> RenderableType:
        if self.model is None:
            return Text("waiting for the first snapshot…")
        if not self.model.cells:
            return Text(self.no_ranks)
        if not self.model.selectable_rows():
            return Text(f"no rank matches the filter {self.model.query!r}")
        if self.model.grouped:
            return self.render_groups(self.model.groups)
        return self.render_rows(self.model.rows)

    def render_rows(self, rows: list[StageRow]) -> RenderableType:
        table = Table(box=box.ROUNDED, show_lines=True, expand=True, padding=0)
        table.add_column("", no_wrap=True)
        for column in range(len(rows[0].cells)):
            table.add_column(f"tp {column}", ratio=1, no_wrap=True, overflow="ellipsis")
        stage_style = self.get_component_rich_style("rank-grid--stage")
        for row in rows:
            cells = [self.cell_text(cell) if cell else Text("") for cell in row.cells]
            table.add_row(Text(f"stage {row.stage} ", style=stage_style), *cells)
        return table

    def cell_text(self, cell: RankCell) -> Text:
        selected = cell.rank == self.selected
        lines = cell_lines(cell, selected)
        return Text("\n".join(map(shown, lines)), style=self.state_style(cell.state, selected),
                    no_wrap=True)

    def render_groups(self, groups: list[GroupLine]) -> RenderableType:
        text = Text(no_wrap=True, overflow="ellipsis")
        stage_style = self.get_component_rich_style("rank-grid--stage")
        for line in groups:
            chosen = self.selected in line.ranks
            text.append("▸ " if chosen else "  ")
            stages = (f"stage {line.first_stage}" if line.first_stage == line.last_stage
                      else f"stages {line.first_stage}-{line.last_stage}")
            text.append(f"{stages}: ", style=stage_style)
            for i, (state, count) in enumerate(line.counts.items()):
                text.append(", " if i else "")
                text.append(f"{count} {state}", style=self.state_style(state))
                if state in NAMED_STATES:
                    text.append(f" [{ranks_label(line.named[state])}]")
            if chosen:
                text.append(f"   ▸ rank {self.selected}", style=self.get_component_rich_style("rank-grid--selected"))
            text.append("\n")
        text.rstrip()
        return text

    def selected_region(self) -> Region | None:
        """Where the selected rank's row sits, in lines from the top of the grid."""
        if self.model is None or self.selected is None:
            return None
        for y, ranks in enumerate(self.model.selectable_rows()):
            if self.selected in ranks:
                if self.model.grouped:
                    return Region(0, y, self.size.width, 1)
                # top border, header, header rule; then each row and the rule under it
                return Region(0, 3 + y * (CELL_LINES + 1), self.size.width, CELL_LINES)
        return None

    def scroll_to_selected(self) -> None:
        region = self.selected_region()
        if region is not None and self.parent is not None:
            self.parent.scroll_to_region(region.translate(self.virtual_region.offset), animate=False)
