"""Reading the small files of a run dir (JSON written by the launcher or a
probe) without trusting what is there: only a regular file is read, opened
without blocking (a FIFO in its place is refused, not waited on), and only up
to a size that file can have."""
from __future__ import annotations

import os
import stat


class FileRefused(OSError):
    """Not a regular file, or larger than such a file can be."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.strerror = reason


def read_small(path: str, limit: int) -> bytes:
    """The file's bytes; OSError (FileRefused among them) otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FileRefused("not a regular file")
        if info.st_size > limit:
            raise FileRefused(f"{info.st_size} bytes, over the {limit} such a file may have")
        return os.read(fd, limit + 1)
    finally:
        os.close(fd)
