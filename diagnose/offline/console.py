"""The console diag's reports print to. On a terminal, the terminal's width; to
a pipe or a file (a CI log), wide enough that no field is cut to `…` and no
line wraps: renderables there take the width of their content."""
from __future__ import annotations

from rich.console import Console

PIPE_WIDTH = 4096       # wider than any line a report holds


def output_console(stderr: bool = False, highlight: bool = True) -> Console:
    console = Console(stderr=stderr, highlight=highlight)
    if console.is_terminal:
        return console
    return Console(stderr=stderr, highlight=highlight, width=PIPE_WIDTH)


def fills_screen(console: Console) -> bool:
    """Whether tables and panels should stretch to the console's width (a
    terminal) or keep to their content (a pipe, a file)."""
    return console.width < PIPE_WIDTH
