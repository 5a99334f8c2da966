"""Text that came from files, logs or processes, made safe for a terminal.

A frame name in a probe file, a phase from a Flight Recorder dump or a line of
a log can hold escape sequences (clear the screen, retitle the window, print
fake text), a carriage return that overwrites its own line, or invisible
bidirectional overrides. Every printer of diag and the TUI passes such text
through `shown`, which writes each of those characters as its escape
(`\\x1b`, `\\u202e`); printable text, Unicode included, is left as it is.
"""
from __future__ import annotations

import re

# C0 controls, DEL, C1 controls (0x9b is a one-byte CSI), and the invisible
# formatting characters: bidirectional marks, embeddings, overrides, isolates;
# zero-width spaces and joiners; line and paragraph separators; the BOM.
_FORMAT = "\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ufff9-\ufffb"
_ONE_LINE = re.compile(f"[\x00-\x1f\x7f-\x9f{_FORMAT}]")
_LINES = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_FORMAT}]")    # keeps \t and \n


def shown(text: str, lines: bool = False) -> str:
    """`text` with every control and invisible formatting character escaped;
    with lines, tabs and newlines are kept (a stack, a log's lines)."""
    pattern = _LINES if lines else _ONE_LINE
    if not isinstance(text, str):
        text = str(text)
    if pattern.search(text) is None:
        return text
    return pattern.sub(_escape, text)


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
