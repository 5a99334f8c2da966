"""Stack frames as diag shows them, and the text stacks other tools write.

A Python frame is "dir/file.py:LINE function"; a native frame (py-spy
--native) is "[native] library function". faulthandler's text (a fatal-signal
dump, or torch.distributed.debug's stacks, which its workers take with
faulthandler) is read back into threads of such frames.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

NATIVE_MARK = "[native] "
THREAD_LINE = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")
FRAME_LINE = re.compile(r'^\s+File "(?P<file>.+)", line (?P<line>\d+) in (?P<name>.+)$')


def frame_label(filename: str, lineno: int, function: str) -> str:
    """The last directory and the file name keep labels short but unambiguous."""
    parent, name = os.path.split(filename)
    short = f"{os.path.basename(parent)}/{name}" if parent else name
    return f"{short}:{lineno} {function}"


def native_label(library: str, function: str) -> str:
    return f"{NATIVE_MARK}{os.path.basename(library)} {function}"


def is_native(label: str) -> bool:
    return label.startswith(NATIVE_MARK)


@dataclass
class TextThread:
    """One thread of faulthandler's text: its frames outermost first, as
    (file, line, function)."""
    ident: int
    current: bool               # the thread that wrote the dump
    frames: list[tuple[str, int, str]] = field(default_factory=list)


def faulthandler_threads(lines: list[str], max_frames: int = 256) -> list[TextThread]:
    """The threads of faulthandler's text, in the order written; lines that are
    neither a thread's head nor its frame end nothing and are skipped. At most
    max_frames frames of a thread are kept (faulthandler writes 100)."""
    threads: list[TextThread] = []
    for line in lines:
        head = THREAD_LINE.match(line)
        if head:
            threads.append(TextThread(int(head[2], 16), head[1] == "Current thread"))
            continue
        frame = FRAME_LINE.match(line)
        if frame and threads and len(threads[-1].frames) < max_frames:
            threads[-1].frames.insert(0, (frame["file"], int(frame["line"]), frame["name"]))
    return threads
