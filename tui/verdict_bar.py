"""The verdict in one sentence: the culprit in red, the ranks waiting on it in yellow."""
from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from diagnose.core.snapshot import Verdict
from diagnose.core.vocab import Mention
from diagnose.offline.report import summary_text


class VerdictBar(Widget):
    COMPONENT_CLASSES = {"verdict-bar--culprit", "verdict-bar--victim", "verdict-bar--ok"}

    verdicts: reactive[list[Verdict]] = reactive(list)

    def render(self) -> Text:
        if not self.verdicts:
            return Text("no hang detected", style=self.get_component_rich_style("verdict-bar--ok"))
        styles = {Mention.CULPRIT: self.get_component_rich_style("verdict-bar--culprit"),
                  Mention.VICTIMS: self.get_component_rich_style("verdict-bar--victim")}
        sentence = summary_text(self.verdicts[0], styles)
        if len(self.verdicts) > 1:
            sentence.append(f"  (+{len(self.verdicts) - 1} more)")
        return sentence
