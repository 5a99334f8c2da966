"""What each rank is doing now, seen from outside: py-spy dumps of the ranks that
stopped moving, classified (analysis.activity) and written to state-R.json,
which every collector reads back into RankState.activity.

The launcher calls `StateSampler.update(snapshot)` after each snapshot; it only
looks at times and hands the dumps to a thread pool, so the watch loop never
waits for py-spy. A rank is sampled once its position (phases, collectives,
ring reads) has not moved for STILL_S, then again while it stays still, every
RESAMPLE_S at first and less often while the samples agree; one dump per rank
at a time. A rank idle in dequeue is not sampled: its position says it waits
for work. A compiler started by the rank (cc,
g++, nvcc, ptxas, ...) or a busy Inductor compile worker makes it compiling,
whatever its stack says.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace

import psutil

from diagnose.analysis.activity import CompileSeen, classify
from diagnose.analysis.position import last_progress
from diagnose.core import runfile
from diagnose.core.schema import Document, stamped
from diagnose.core.snapshot import ActivitySample, Pause, RankState, Snapshot
from diagnose.core.vocab import Activity, Phase
from diagnose.launch.py_spy import py_spy_dump

STILL_S = 1.0          # a rank whose position has not moved for this long is sampled
RESAMPLE_S = 2.0       # and again this often while it stays still, at first; the gap
MAX_RESAMPLE_S = 16.0  # doubles with each sample that finds it the same, up to this
MAX_WORKERS = 8        # py-spy dumps at once
DUMP_TIMEOUT_S = 10.0
MAX_NOTES = 20         # distinct reasons a sample failed, kept for the report
PAUSES_KEPT_S = 600.0  # diag's stops of ranks, kept this long for the analysis
COMPILERS = frozenset({"cc", "cc1", "cc1plus", "c++", "gcc", "g++", "clang", "clang++", "ld",
                       "ld.lld", "nvcc", "ptxas", "cicc", "fatbinary", "nvlink", "ninja"})
COMPILE_WORKER = "compile_worker"   # Inductor's pool: alive between compiles, busy in one
BUSY_SHARE = 0.02      # CPU seconds per second that make a sampled rank busy: a blocked
                       # one spends next to none; a computing one on a host loaded 20
                       # times over its cores still gets this much


class StateSampler:
    def __init__(self, run_dir: str):
        self.run_dir = run_dir
        self.host = socket.gethostname()
        self.pool = ThreadPoolExecutor(max_workers=MAX_WORKERS, thread_name_prefix="diag-state")
        self.lock = threading.Lock()
        self.busy: set[int] = set()                       # ranks with a dump under way
        self.sampled_at: dict[int, float] = {}            # rank -> when its last dump began
        self.gap: dict[int, tuple[float, tuple]] = {}     # rank -> (resample gap, last finding)
        self.compile_seen: dict[int, CompileSeen] = {}
        self.worker_cpu: dict[int, tuple[float, float]] = {}   # compile worker pid -> (when,
                                                               # its CPU time then)
        self.rank_cpu: dict[int, tuple[float, float]] = {}  # pid -> (when, its CPU time)
        self.python_only: dict[int, str] = {}             # pid -> why py-spy gives it no
                                                          # native frames
        self.pauses: list[Pause] = []                     # native dumps: each stops a rank
        self.notes: list[str] = []                        # samples that failed, and why

    def seen(self, snapshot: Snapshot) -> Snapshot:
        """The snapshot as the sampler leaves it for the analysis: samples due are
        handed to the pool; a rank a dump may be stopping counts as seen now (its
        stall goes on: it made no progress); the snapshot says states are sampled."""
        self.update(snapshot)
        dumping = self.dumping()
        ranks = {rank: replace(state, heartbeat_at=snapshot.taken_at)
                 if rank in dumping and state.alive else state
                 for rank, state in snapshot.ranks.items()}
        return replace(snapshot, ranks=ranks, sampling=True, paused=self._pauses(snapshot.taken_at))

    def _pauses(self, now: float) -> list[Pause]:
        """Copies of the pauses that ended less than PAUSES_KEPT_S ago."""
        with self.lock:
            self.pauses = [pause for pause in self.pauses
                           if pause.end is None or now - pause.end < PAUSES_KEPT_S]
            return [replace(pause) for pause in self.pauses]

    def update(self, snapshot: Snapshot) -> None:
        now = snapshot.taken_at
        for rank, state in snapshot.ranks.items():
            if not state.alive or state.identity.host != self.host:
                continue
            if now - last_progress(state) < STILL_S or _idle(state):
                continue
            with self.lock:
                gap = self.gap.get(rank, (RESAMPLE_S, None))[0]
                if rank in self.busy or now - self.sampled_at.get(rank, 0.0) < gap:
                    continue
                self.busy.add(rank)
                self.sampled_at[rank] = now
            self.pool.submit(self._sample, rank, state)

    def quiet(self, wait_s: float = DUMP_TIMEOUT_S) -> None:
        """Waits (up to wait_s) until no dump is under way: py-spy stops a rank while
        it reads it, and two at once on one rank fail."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            with self.lock:
                if not self.busy:
                    return
            time.sleep(0.02)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _sample(self, rank: int, state: RankState) -> None:
        try:
            sample = self.sample(rank, state.identity.pid)
            write_state(self.run_dir, rank, sample)
            self._space(rank, (state.identity.pid, sample.activity, sample.frame, sample.busy))
        except OSError:
            pass                       # the run dir went away: nothing to tell
        except Exception as error:     # noqa: BLE001 - one failed sample must not end sampling
            self._failed(rank, error)
        finally:
            with self.lock:
                self.busy.discard(rank)

    def _failed(self, rank: int, error: Exception) -> None:
        """A sample that failed says why in the report, once for each reason."""
        note = f"the state sample of rank {rank} failed: {type(error).__name__}: {error}"
        with self.lock:
            if note not in self.notes and len(self.notes) < MAX_NOTES:
                self.notes.append(note)

    def _space(self, rank: int, finding: tuple) -> None:
        """The next sample of a rank that stays still comes later each time it finds
        the same: a hang does not change, and each native dump pauses the rank."""
        with self.lock:
            gap, last = self.gap.get(rank, (RESAMPLE_S, None))
            busy = finding[-1]          # a busy rank's samples are its progress: keep them
            gap = min(2 * gap, MAX_RESAMPLE_S) if finding == last and not busy else RESAMPLE_S
            self.gap[rank] = (gap, finding)

    def sample(self, rank: int, pid: int) -> ActivitySample:
        """A look at the rank's children first: one that compiles makes the rank
        compiling whatever its stack says, so it is neither dumped nor paused (on
        a starved host a dump takes 10-40 s, past many a compile). Else its dumps
        (_dumped), and the children again after them."""
        taken_at = time.time()
        child = compiler_child(pid, self.worker_cpu)
        sample = ActivitySample(Activity.COMPILING, taken_at, pid) if child \
            else self._dumped(rank, pid, taken_at)
        sample.note = sample.note or self.python_only.get(pid)
        sample.busy = self._busy(pid, taken_at)
        child = child or compiler_child(pid, self.worker_cpu)
        if child is not None:
            sample.activity, sample.rule, sample.frame = Activity.COMPILING, "compile-child", child
        seen = self.compile_seen.setdefault(rank, CompileSeen())
        seen.add(sample.activity, taken_at, sample.busy)
        sample.compiling_since, sample.compiled_at = seen.since, seen.at
        sample.done_at = time.time()
        return sample

    def _dumped(self, rank: int, pid: int, taken_at: float) -> ActivitySample:
        """A Python-only dump first: it does not stop the rank and tells a collective
        called from Python, a compile or a wait for work; only where it finds the
        rank running its own code, a native one too (a C++ collective, a sleep)."""
        dump = py_spy_dump(pid, timeout=DUMP_TIMEOUT_S, nonblocking=True)
        sample = self._classified(pid, taken_at, dump, native=False)
        if sample.activity == Activity.RUNNING and pid not in self.python_only:
            native = self._native_dump(rank, pid)
            if native.note and native.threads is not None:
                self.python_only[pid] = native.note   # later samples skip the native dump
            if native.threads is not None:
                sample = self._classified(pid, taken_at, native, native=not native.note)
        return sample

    def _native_dump(self, rank: int, pid: int):
        """py-spy --native stops the rank while it reads it (up to DUMP_TIMEOUT_S on
        a loaded host): a pause of diag's, which no stall of the job may count."""
        pause = Pause(rank, time.time())
        with self.lock:
            self.pauses.append(pause)
        try:
            return py_spy_dump(pid, native=True, timeout=DUMP_TIMEOUT_S)
        finally:
            with self.lock:
                pause.end = time.time()

    @staticmethod
    def _classified(pid: int, taken_at: float, dump, native: bool) -> ActivitySample:
        frames = (dump.threads or {}).get(dump.main or "", [])
        found = classify(frames)
        return ActivitySample(activity=found.activity, taken_at=taken_at, pid=pid,
                              frame=found.frame, rule=found.rule, frames=frames, native=native,
                              note=dump.note, denied=dump.denied)

    def dumping(self) -> set[int]:
        """The ranks a dump may be stopping now: their heartbeat stands still because
        of diag, not of them."""
        with self.lock:
            return set(self.busy)

    def _busy(self, pid: int, now: float) -> bool:
        """The process used CPU for at least BUSY_SHARE of the time since its last
        sample: it computes (a long kernel), it is not blocked."""
        try:
            cpu = sum(psutil.Process(pid).cpu_times()[:2])
        except psutil.Error:
            return False
        last = self.rank_cpu.get(pid)
        self.rank_cpu[pid] = (now, cpu)
        return last is not None and cpu - last[1] >= BUSY_SHARE * (now - last[0])


def compiler_child(pid: int, worker_cpu: dict[int, tuple[float, float]]) -> str | None:
    """'g++ (pid 123)' for a compiler the process started, or a compile worker of
    its busy since the last look (worker_cpu: compile worker pid -> (when, its
    CPU time then), kept by the caller); None if none. Inductor's pool lives as
    long as the process: idle, a worker still wakes now and then (it watches its
    parent), so only a worker that used BUSY_SHARE of the time since is compiling."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return None
    for child in children:
        try:
            with child.oneshot():
                name = child.name()
                if name in COMPILERS:
                    return f"{name} (pid {child.pid})"
                if any(COMPILE_WORKER in part for part in child.cmdline()) and \
                        _worker_busy(child, worker_cpu):
                    return f"an Inductor compile worker (pid {child.pid})"
        except psutil.Error:
            continue
    return None


def _worker_busy(child: psutil.Process, worker_cpu: dict[int, tuple[float, float]]) -> bool:
    now, cpu = time.monotonic(), sum(child.cpu_times()[:2])
    last = worker_cpu.get(child.pid)
    worker_cpu[child.pid] = (now, cpu)
    return last is not None and cpu - last[1] >= BUSY_SHARE * (now - last[0])


def _idle(state: RankState) -> bool:
    phase = state.open_phases[-1] if state.open_phases else None
    return phase is not None and phase.name == Phase.DEQUEUE


def write_state(run_dir: str, rank: int, sample: ActivitySample) -> None:
    """Written beside, then renamed: a reader sees the old sample or the new one."""
    path = os.path.join(run_dir, runfile.state_file_name(rank))
    tmp = os.path.join(run_dir, "." + os.path.basename(path) + ".tmp")
    with open(tmp, "w") as out:
        json.dump(stamped(Document.STATE, asdict(sample)), out)
    os.replace(tmp, path)
