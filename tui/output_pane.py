"""The command's own output (what `diag launch` copies to output.log): where a
server says it listens, the text a generate run prints, a traceback at start-up."""
from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.reactive import reactive
from textual.widgets import Static

from diagnose.core.shown import shown
from tui.log_files import LogTail


class OutputPane(VerticalScroll):
    """Shown once the command has printed something, unless `o` hid it."""

    tail: reactive[LogTail | None] = reactive(None)
    hidden: reactive[bool] = reactive(False)

    def compose(self) -> ComposeResult:
        yield Static(id="output-text")

    def watch_tail(self, old: LogTail | None, new: LogTail | None) -> None:
        self.display = self.shown
        if new is None or not new.lines:
            return
        self.border_title = f"command output ({new.name})"
        self.query_one("#output-text", Static).update(Text(shown("\n".join(new.lines),
                                                                 lines=True)))
        self.call_after_refresh(self.scroll_end, animate=False)

    def watch_hidden(self) -> None:
        self.display = self.shown

    @property
    def has_lines(self) -> bool:
        return self.tail is not None and bool(self.tail.lines)

    @property
    def shown(self) -> bool:
        return not self.hidden and self.has_lines
