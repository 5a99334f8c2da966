"""The verdict in one sentence: the culprit in red, the ranks waiting on it in yellow;
diag launch's, said so, while they were made on newer ranks than the view's."""
from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from diagnose.core.snapshot import Verdict
from diagnose.core.vocab import Mention
from diagnose.offline.report import summary_text
from tui.status import clock


class VerdictBar(Widget):
    COMPONENT_CLASSES = {"verdict-bar--culprit", "verdict-bar--victim", "verdict-bar--ok",
                         "verdict-bar--source"}

    verdicts: reactive[list[Verdict]] = reactive(list)
    said_by: reactive[str] = reactive("")   # whose verdicts, where not this view's

    def show_launchers(self, verdicts: list[Verdict], taken_at: float,
                       ranks_as_of: float | None) -> None:
        """diag launch's verdicts, said to be: made at taken_at, on newer ranks than
        the grid's (as of ranks_as_of; None: none read yet)."""
        shown = "reading the run dir…" if ranks_as_of is None else \
            f"the ranks below are as of {clock(ranks_as_of)}"
        self.said_by = f"  · as diag launch judged it at {clock(taken_at)}; {shown}"
        self.verdicts = verdicts

    def render(self) -> Text:
        said = self.render_verdicts()
        if self.said_by:
            said.append(self.said_by, style=self.get_component_rich_style("verdict-bar--source"))
        return said

    def render_verdicts(self) -> Text:
        if not self.verdicts:
            return Text("no hang detected", style=self.get_component_rich_style("verdict-bar--ok"))
        styles = {Mention.CULPRIT: self.get_component_rich_style("verdict-bar--culprit"),
                  Mention.VICTIMS: self.get_component_rich_style("verdict-bar--victim")}
        sentence = summary_text(self.verdicts[0], styles)
        if len(self.verdicts) > 1:
            sentence.append(f"  (+{len(self.verdicts) - 1} more)")
        return sentence
