"""? or F1 (or h, as in htop): every key of the TUI, read from the bindings
themselves, so the list cannot drift from what the keys do."""
from __future__ import annotations

from dataclasses import replace

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import Static

HELP_KEYS = "question_mark,f1,h"


class HelpScreen(ModalScreen[None]):
    """Sections of (title, bindings); a binding's tooltip says what it does, and
    neighbouring bindings that say the same share a line."""

    BINDINGS = [Binding(f"escape,q,{HELP_KEYS}", "dismiss", "Close")]
    COMPONENT_CLASSES = {"help-screen--section", "help-screen--keys"}

    def __init__(self, sections: list[tuple[str, list[Binding]]]) -> None:
        super().__init__()
        self.sections = sections

    def compose(self) -> ComposeResult:
        yield Static(self.keys_table(), id="help-keys")

    def on_mount(self) -> None:
        panel = self.query_one("#help-keys")
        panel.border_title = "diag: keys"
        panel.border_subtitle = "esc, q or ? closes"

    def keys_table(self) -> Table:
        key_style = self.get_component_rich_style("help-screen--keys", partial=True)
        section_style = self.get_component_rich_style("help-screen--section", partial=True)
        table = Table(box=None, show_header=False, padding=(0, 2, 0, 0))
        table.add_column(no_wrap=True, style=key_style)
        table.add_column()
        for title, bindings in self.sections:
            table.add_row(Text(title, style=section_style), "")
            for keys, says in self.lines(bindings):
                table.add_row(f"  {keys}", says)
        return table

    def lines(self, bindings: list[Binding]) -> list[tuple[str, str]]:
        lines: list[tuple[str, str]] = []
        for binding in bindings:
            says = binding.tooltip or binding.description
            keys = " ".join(self.app.get_key_display(replace(binding, key=key.strip(), key_display=None))
                            for key in binding.key.split(","))
            if lines and lines[-1][1] == says:
                keys = f"{lines[-1][0]} {keys}"
                lines.pop()
            lines.append((keys, says))
        return lines
