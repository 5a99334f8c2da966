"""The verdict in one sentence: the culprit in red, the ranks waiting on it in yellow."""
from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from diagnose.report import CULPRIT_NAME, VICTIMS_TAIL
from diagnose.snapshot import Verdict


class VerdictBar(Widget):
    COMPONENT_CLASSES = {"verdict-bar--culprit", "verdict-bar--victim", "verdict-bar--ok"}

    verdicts: reactive[list[Verdict]] = reactive(list)

    def render(self) -> Text:
        if not self.verdicts:
            return Text("no hang detected", style=self.get_component_rich_style("verdict-bar--ok"))
        sentence = Text(self.verdicts[0].summary)
        sentence.highlight_regex(CULPRIT_NAME, self.get_component_rich_style("verdict-bar--culprit"))
        sentence.highlight_regex(VICTIMS_TAIL, self.get_component_rich_style("verdict-bar--victim"))
        if len(self.verdicts) > 1:
            sentence.append(f"  (+{len(self.verdicts) - 1} more)")
        return sentence
