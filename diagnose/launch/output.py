"""The command's output, as it comes: every line to output.log in the run dir,
to the terminal through `echo` (stderr, the live view's console, or nowhere
while the TUI owns the screen), and its last lines and the addresses a server in
it announced kept for the end. diag's own lines about the job (what it waits
for, that it ended the job) go the same way, each starting with DIAG_PREFIX, so
a capture of the terminal, and output.log, say what diag did where it did it."""
from __future__ import annotations

import os
import sys
import threading
from collections import deque
from typing import Callable

from diagnose.core.output import OUTPUT_LOG, addresses
from diagnose.core.shown import shown

TAIL_LINES = 200
LAST_LINES = 10          # what the end of a run shows of the output
FINISH_WAIT_S = 2.0      # for the last lines, once the job has ended
DIAG_PREFIX = "diag: "


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
        self.log = None
        self.lock = threading.Lock()   # a line of diag's never lands inside one of the job's

    def follow(self, stream) -> None:
        """Copy `stream` (the command's stdout and stderr) from a thread, into a
        fresh output.log: a restarted command starts a new one."""
        self.tail.clear()
        self.servers = []
        self.log = open(self.path, "wb")
        self.reader = threading.Thread(target=self._copy, args=(stream, self.log), daemon=True)
        self.reader.start()

    def _copy(self, stream, log) -> None:
        try:
            for line in iter(stream.readline, b""):
                text = line.decode(errors="replace").rstrip("\r\n")
                self.servers = addresses([text], self.servers)
                self.tail.append(text)
                self._write(line, self.echo)
        finally:
            with self.lock:
                log.close()

    def say(self, text: str, echo: bool = True) -> None:
        """One line of diag's own, into the output where it happens: output.log, and
        the terminal unless `echo` is False (a view that shows it already). What
        it quotes of the ranks' files is escaped."""
        self._write(f"{DIAG_PREFIX}{shown(text)}\n".encode(), self.echo if echo else None)

    def _write(self, line: bytes, echo) -> None:
        with self.lock:
            if self.log is not None and not self.log.closed:
                self.log.write(line)
                self.log.flush()
            if echo is not None:
                echo(line)

    def finish(self) -> None:
        """Wait (briefly) for the lines still in the pipe: the job has ended."""
        if self.reader is not None:
            self.reader.join(FINISH_WAIT_S)

    def last_lines(self, count: int = LAST_LINES) -> list[str]:
        return list(self.tail)[-count:]
