"""Reading the log file of a child process that is still writing it."""
from __future__ import annotations

import os
from typing import IO


def text_so_far(log: IO[bytes]) -> str:
    """What the child has written to `log` (a file passed as its stdout or stderr).

    The child shares the file's offset: seek(0) then read() here would move the offset
    it writes at, and the lines it writes meanwhile would land over earlier ones and
    be lost. pread reads from the start without moving it."""
    fd = log.fileno()
    return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")
