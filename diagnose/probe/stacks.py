"""Python stacks of a rank, taken from inside it (the probe's dump on request):
{thread name: frames}, outermost frame first, each frame "dir/file.py:LINE function"."""
from __future__ import annotations

import json
import os
import sys
import threading
import time

from diagnose.core.frames import frame_label
from diagnose.core.schema import Document, stamped


def frames_of(frame) -> list[str]:
    labels = []
    while frame is not None:
        labels.append(frame_label(frame.f_code.co_filename, frame.f_lineno,
                                  frame.f_code.co_name))
        frame = frame.f_back
    return labels[::-1]


def thread_stacks(skip_ident: int | None = None) -> dict[str, list[str]]:
    """Every thread of this process except `skip_ident`, by thread name."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    stacks = {}
    for ident, frame in sys._current_frames().items():
        if ident == skip_ident:
            continue
        name = names.get(ident, "thread")
        if name in stacks:
            name = f"{name} ({ident})"
        stacks[name] = frames_of(frame)
    return stacks


def write_stacks_file(path: str, stacks: dict[str, list[str]], pid: int,
                      request: int) -> None:
    """Written beside, then renamed: a reader sees the old file or the new one."""
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    with open(tmp, "w") as out:
        json.dump(stamped(Document.STACKS, {"pid": pid, "taken_at": time.time(),
                                            "request": request, "threads": stacks}), out)
    os.replace(tmp, path)
