"""Asked on `q` when the TUI launched the job: stop it, or leave it running?"""
from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid
from textual.screen import ModalScreen
from textual.widgets import Button, Label

STOP, LEAVE = "stop", "leave"


class QuitScreen(ModalScreen[str | None]):
    """Dismisses with STOP, LEAVE, or None to stay."""

    BINDINGS = [
        Binding("s", "choose('stop')", "Stop the job",
                tooltip="stop the job (every process of it), then quit"),
        Binding("l", "choose('leave')", "Leave it running",
                tooltip="quit and leave the job running: diag launch watches it to its end"),
        Binding("escape", "choose(None)", "Cancel", tooltip="back to the TUI"),
    ]

    def compose(self) -> ComposeResult:
        with Grid(id="quit-dialog"):
            yield Label("Quit: stop the job, or leave it running?", id="quit-question")
            yield Button("Stop the job (s)", variant="error", id=STOP)
            yield Button("Leave it running (l)", variant="primary", id=LEAVE)
            yield Button("Cancel (esc)", id="cancel")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id if event.button.id in (STOP, LEAVE) else None)

    def action_choose(self, choice: str | None) -> None:
        self.dismiss(choice)
