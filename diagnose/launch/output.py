"""The command's output, as it comes: every line to output.log in the run dir,
to the terminal through `echo` (stderr, the live view's console, or nowhere
while the TUI owns the screen), and its last lines and the addresses a server in
it announced kept for the end."""
from __future__ import annotations

import os
import sys
import threading
from collections import deque
from typing import Callable

from diagnose.core.output import OUTPUT_LOG, addresses

TAIL_LINES = 200
LAST_LINES = 10          # what the end of a run shows of the output
FINISH_WAIT_S = 2.0      # for the last lines, once the job has ended


def to_stderr(line: bytes) -> None:
    sys.stderr.buffer.write(line)
    sys.stderr.flush()


class CommandOutput:
    def __init__(self, run_dir: str, echo: Callable[[bytes], None] | None):
        self.path = os.path.join(run_dir, OUTPUT_LOG)
        self.echo = echo
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.servers: list[str] = []
        self.reader: threading.Thread | None = None

    def follow(self, stream) -> None:
        """Copy `stream` (the command's stdout and stderr) from a thread, into a
        fresh output.log: a restarted command starts a new one."""
        self.tail.clear()
        self.servers = []
        log = open(self.path, "wb")
        self.reader = threading.Thread(target=self._copy, args=(stream, log), daemon=True)
        self.reader.start()

    def _copy(self, stream, log) -> None:
        with log:
            for line in iter(stream.readline, b""):
                log.write(line)
                log.flush()
                text = line.decode(errors="replace").rstrip("\r\n")
                self.tail.append(text)
                self.servers = addresses([text], self.servers)
                echo = self.echo
                if echo is not None:
                    echo(line)

    def finish(self) -> None:
        """Wait (briefly) for the lines still in the pipe: the job has ended."""
        if self.reader is not None:
            self.reader.join(FINISH_WAIT_S)

    def last_lines(self, count: int = LAST_LINES) -> list[str]:
        return list(self.tail)[-count:]
