"""The head's analysis in a forked process of its own, one poll's snapshot at a time.

At 16,384 ranks one analysis takes a second or two of a core. In the head's
interpreter it shared the GIL with the threads that apply the nodes' reports,
and when the ranks stopped and every node sent their rings at once, the poll
then running judged the job as it stood before them, slowly, while it slowed
their application in turn: the verdict waited for the poll after it (#28).

A forked judge works on the snapshot as it was at the fork (copy-on-write: no
copy is made, and no object of a snapshot is modified later), on a core of its
own, and writes its verdicts to a pipe as JSON; the head's threads go on
applying reports meanwhile. When to judge:

- Large reports applied (a node's whole state, or the rings of its ranks that
  stopped), once no other is being read (`NodeHub.news`), are news: a judge
  whose snapshot predates them is ended and a new one starts on a snapshot
  that holds them, unless the judgments have been held up so for STALE_S
  already (reports that never stop coming cannot keep every judgment from
  finishing). For ALERT_S after news, judges run back to back: the stall that
  the rings show passes its limit soon.
- While a large report is being read or applied, no judge starts: the
  snapshot the poll has is about to be old news, and a fork then costs the
  head's threads the pages they write (copy-on-write) and the cores they need
  (at 16,384 ranks the judge started mid-way through the rings was ended
  1.5 s later, unfinished). The wait ends with the report, or after STALE_S.
- Otherwise a judge rests as long as the last judgment took before the next
  starts: at 16,384 ranks, healthy, the head judges half the time, not all of it.

A judge that fails, or runs past JUDGE_WAIT_S, is ended, and that snapshot is
judged in the head itself (with a note): a verdict is never lost to the fork.
A judge's copy-on-write pages cost: at 16,384 ranks it copies about 400 MB of
the head's pages as it reads them (0.3 s of the kernel's time on 2 cores), a
third more CPU than the same analysis in the head.

The head's poll gets the latest finished judgment, paired with the snapshot it
judged; the last one, once the command has ended, is made in the head as
before.
"""
from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from diagnose.core.snapshot import Judged, Snapshot, Verdict
from diagnose.core.workers import cores
from diagnose.launch.job import die_with_parent

ALERT_S = 10.0          # judges run back to back this long after a large report
STALE_S = 5.0           # judges held up this long by newer reports: the next one finishes
JUDGE_WAIT_S = 120.0    # a judge still running then is ended, and its snapshot judged here
MAX_ANSWER = 64 << 20   # bytes of verdicts a judge may write
MIN_CORES = 4


def can_fork() -> bool:
    return hasattr(os, "fork") and sys.platform.startswith("linux")


def judges_apart() -> bool:
    """Whether the head judges in a fork: on Linux, with a core for the judge
    beside the head's own and its readers'. On fewer, a judge only takes turns
    with the head for the cores, and its copy-on-write pages are a loss."""
    return can_fork() and cores() >= MIN_CORES


@dataclass
class _Running:
    pid: int
    answer: int                  # the pipe's read end
    snapshot: Snapshot
    generation: int              # the hub's large reports applied when it was taken
    started: float               # time.monotonic()
    read: list[bytes] = field(default_factory=list)


class ForkedJudge:
    """`judge` starts judges and hands back the latest finished judgment."""

    def __init__(self, analyze: Callable[[Snapshot], list[Verdict]]):
        self.analyze = analyze
        self.running: _Running | None = None
        self.done: Judged | None = None
        self.notes: list[str] = []
        self.generation = 0
        self.alert_until = 0.0       # monotonic: judges back to back until then
        self.last: _Running | None = None    # the last judge started
        self.took = 0.0              # how long the last finished judgment took
        self.held_since: float | None = None  # a judge was first ended for newer reports

    def judge(self, snapshot: Snapshot, generation: int, incoming: bool = False
              ) -> Judged | None:
        """The latest finished judgment (None before the first); starts or ends
        judges as the module says. `generation`: the hub's large reports applied;
        `incoming`: one is being read or applied now."""
        now = time.monotonic()
        if generation != self.generation:
            self.generation, self.alert_until = generation, now + ALERT_S
        if self.running is not None:
            self._collect(self.running)
        if self.running is not None and self.running.generation != generation \
                and now - (self.held_since or now) < STALE_S:
            self.held_since = self.held_since or now
            self._end(self.running)
        if self.running is None and self._due(now, generation) \
                and not self._awaits(incoming, now):
            self.running = self.last = self._start(snapshot, generation)
        return self.done

    def _awaits(self, incoming: bool, now: float) -> bool:
        """Whether the next judge waits for the large report coming in: yes,
        unless the judgments have been held up for STALE_S already."""
        if not incoming:
            return False
        self.held_since = self.held_since or now
        return now - self.held_since < STALE_S

    def _due(self, now: float, generation: int) -> bool:
        last = self.last
        return (last is None or last.generation != generation or now < self.alert_until
                or now - last.started >= 2 * self.took)

    def close(self) -> None:
        if self.running is not None:
            self._end(self.running)

    def _start(self, snapshot: Snapshot, generation: int) -> _Running:
        answer, write = os.pipe()
        pid = os.fork()
        if pid == 0:                             # the judge
            os.close(answer)
            _judge_and_exit(self.analyze, snapshot, write)
        os.close(write)
        os.set_blocking(answer, False)
        return _Running(pid, answer, snapshot, generation, time.monotonic())

    def _collect(self, running: _Running) -> None:
        """Whatever the judge wrote; its judgment once it is done."""
        while select.select([running.answer], [], [], 0)[0]:
            chunk = os.read(running.answer, 1 << 20)
            if not chunk:
                self._finish(running)
                return
            running.read.append(chunk)
            if sum(map(len, running.read)) > MAX_ANSWER:
                self._fail(running, f"it wrote more than {MAX_ANSWER >> 20} MB")
                return
        if time.monotonic() - running.started > JUDGE_WAIT_S:
            self._fail(running, f"it ran past {JUDGE_WAIT_S:g} s")

    def _finish(self, running: _Running) -> None:
        status = self._end(running, kill=False)
        try:
            if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
                raise ValueError(f"it ended with status {status}")
            verdicts = [Verdict.from_dict(body) for body in json.loads(b"".join(running.read))]
        except ValueError as error:
            self._judged_here(running.snapshot, str(error))
            return
        self.done = Judged(running.snapshot, tuple(verdicts))
        self.took, self.held_since = time.monotonic() - running.started, None

    def _fail(self, running: _Running, why: str) -> None:
        self._end(running)
        self._judged_here(running.snapshot, why)

    def _judged_here(self, snapshot: Snapshot, why: str) -> None:
        self.notes.append(f"the forked analysis failed ({why}): judged in the head instead")
        self.done = Judged(snapshot, tuple(self.analyze(snapshot)))
        self.held_since = None

    def _end(self, running: _Running, kill: bool = True) -> int:
        """The judge ended (killed, unless it closed its pipe) and reaped: its status."""
        if kill:
            os.kill(running.pid, signal.SIGKILL)
        _, status = os.waitpid(running.pid, 0)
        os.close(running.answer)
        self.running = None
        return status


def _judge_and_exit(analyze, snapshot: Snapshot, write: int) -> None:
    """In the judge: its verdicts on the snapshot, as JSON on `write`; then it
    exits at once (no handler, buffer or atexit hook of the head's runs here)."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)     # the terminal's Ctrl-C is the head's
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        die_with_parent(signal.SIGKILL)
        data = json.dumps([asdict(verdict) for verdict in analyze(snapshot)],
                          default=str).encode()
        view = memoryview(data)
        while view:
            view = view[os.write(write, view):]
        code = 0
    finally:
        os._exit(code)
