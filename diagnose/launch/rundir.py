"""Opening what `diag analyze`, `diag dump` and `diag tui` are pointed at: a run
dir (the probes' files, read live by the collector), diag attach's run dir (the
snapshot it judged), a directory of PyTorch Flight Recorder dumps, or
torch.distributed.debug's dump directory (each read once; a directory of both
gets the debug dump's stacks on the dumps' ranks).
The sources here are what the TUI shows: a snapshot, its verdicts, and the two
actions it may take on the ranks (a stacks dump, py-spy)."""
from __future__ import annotations

import glob
import json
import os
import time

from diagnose.analysis import analyze
from diagnose.analysis.thresholds import Thresholds
from diagnose.core.files import read_small
from diagnose.core.schema import Document, read_version
from diagnose.core.snapshot import Judged, Snapshot, Verdict, snapshot_from_dict
from diagnose.launch import judged_file
from diagnose.launch.collector import Collector, request_dump
from diagnose.launch.py_spy import ExternalStacks, py_spy_dump
from diagnose.offline.flight_recorder import FlightRecorderError, looks_like_fr_dir, read_fr_dir
from diagnose.offline.torch_debug import DebugDumpError, looks_like_debug_dir, read_debug_dir


class RunDirError(Exception):
    """The path is missing, unreadable, or holds neither probe files nor dumps."""


class Source:
    """What the TUI and `diag analyze` read; subclasses say where it comes from."""
    post_mortem = False      # every wait counts as a hang (dumps of a job already stuck)
    live = True              # its ranks may still run: py-spy and a stacks dump may act

    def __init__(self, run_dir: str):
        self.run_dir = run_dir

    def command(self) -> list[str] | None:
        """What diag launch ran, where it is known."""
        return None

    @property
    def group_names(self) -> dict[str, set[str]]:
        """Other names of a group (torch's pg name and desc) -> the labels diag shows."""
        return {}

    @property
    def unreadable(self) -> list[str]:
        """The probe files the last snapshot could not read, each with why."""
        return []

    def judged(self) -> Judged:
        """What the TUI shows: a snapshot and its verdicts, as one."""
        snapshot = self.snapshot()
        return Judged(snapshot, tuple(self.verdicts(snapshot)))

    def launcher_judgment(self) -> judged_file.LaunchJudgment | None:
        """What diag launch last concluded, where it said so: the TUI shows it while
        its own judgment is older (a head's node files lag what it holds)."""
        return None

    def request_dump(self) -> list[str]:
        """Every live rank writes its stacks; one note per rank that did not."""
        return request_dump(self.run_dir)

    @staticmethod
    def py_spy(pid: int, native: bool) -> ExternalStacks:
        return py_spy_dump(pid, native=native)


class RunDirSource(Source):
    """A run dir, read by the collector each time it is asked: live or finished."""

    def __init__(self, run_dir: str):
        super().__init__(run_dir)
        self.collector = Collector(run_dir)
        self.first: Snapshot | None = None    # open_run's read, handed out once
        self.opened = False                   # a read has shown the run dir judgeable
        self.judgments = judged_file.Reader(run_dir)

    @property
    def notes(self) -> list[str]:
        return self.collector.notes

    @property
    def unreadable(self) -> list[str]:
        return self.collector.unreadable

    def snapshot(self) -> Snapshot:
        first, self.first = self.first, None
        if first is not None:
            return first
        snapshot = self.collector.snapshot()
        if not self.opened:
            self._check_judgeable(snapshot)
            self.opened = True
        return snapshot

    def _check_judgeable(self, snapshot: Snapshot) -> None:
        if not snapshot.ranks and snapshot.driver is None:
            raise RunDirError(f"cannot read any probe file in {self.run_dir}: no readable "
                              f"probe file ({'; '.join(self.notes)})")
        if self.collector.refused:
            raise RunDirError(f"cannot judge the run in {self.run_dir} without "
                              f"{self.collector.refused[0]}")

    def launcher_judgment(self) -> judged_file.LaunchJudgment | None:
        return self.judgments.read()

    def verdicts(self, snapshot: Snapshot, thresholds: Thresholds | None = None) -> list[Verdict]:
        return analyze(snapshot, thresholds)

    def command(self) -> list[str] | None:
        try:
            body = read_version(Document.LAUNCH, json.loads(
                read_small(os.path.join(self.run_dir, Document.LAUNCH), MAX_LAUNCH_BYTES)))
        except (OSError, ValueError):
            return None
        command = body.get("command")
        return command if isinstance(command, list) and all(
            isinstance(part, str) for part in command) else None


class DumpSource(Source):
    """Flight Recorder dumps: written once a job is already stuck, so every wait
    in them counts as a hang unless a stall limit says otherwise."""
    post_mortem = True
    live = False

    def __init__(self, path: str, snapshot: Snapshot, notes: list[str],
                 group_names: dict[str, set[str]] | None = None):
        super().__init__(path)
        self._snapshot, self._notes, self._names = snapshot, notes, group_names or {}

    @property
    def group_names(self) -> dict[str, set[str]]:
        return self._names

    @property
    def notes(self) -> list[str]:
        return self._notes

    def snapshot(self) -> Snapshot:
        return self._snapshot

    def verdicts(self, snapshot: Snapshot, thresholds: Thresholds | None = None) -> list[Verdict]:
        return analyze(snapshot, thresholds or Thresholds(stall_s=0.0))

    def request_dump(self) -> list[str]:
        return ["Flight Recorder dumps hold no live ranks to dump"]


class SnapshotSource(DumpSource):
    """diag attach's run dir: the snapshot it took of a job it did not start,
    judged as a live run is (its stacks say what each rank was doing)."""
    post_mortem = False

    def verdicts(self, snapshot: Snapshot, thresholds: Thresholds | None = None) -> list[Verdict]:
        return analyze(snapshot, thresholds)

    def request_dump(self) -> list[str]:
        return ["this run dir holds the stacks diag attach sampled; run diag attach again "
                "for new ones"]


MAX_SNAPSHOT_BYTES = 256 << 20
MAX_LAUNCH_BYTES = 1 << 20


def open_run(path: str, prefix: str | None = None,
             first_read: bool = True) -> RunDirSource | DumpSource:
    """The source for `path`, once it has shown something readable; prefix names
    the Flight Recorder dumps (PREFIX<rank>) as torchfrtrace's -p does. Without
    first_read, a run dir where diag launch wrote its judgment is read first by
    the source's first snapshot (RunDirError from there)."""
    if not os.path.exists(path):
        raise RunDirError(f"no run dir at {path}: no such file or directory")
    if not os.path.isdir(path):
        raise RunDirError(f"{path} is not a run dir: not a directory (give a run dir or a "
                          f"directory of Flight Recorder dumps)")
    if not os.access(path, os.R_OK | os.X_OK):
        raise RunDirError(f"cannot read the run dir {path}: permission denied")
    if glob.glob(os.path.join(path, "*.probe")):
        if prefix is not None:
            raise RunDirError(f"--prefix names Flight Recorder dump files; {path} is a run dir")
        return _probe_source(path, first_read)
    if os.path.exists(os.path.join(path, Document.SNAPSHOT)):
        return _snapshot_source(path)
    try:
        if prefix is not None or looks_like_fr_dir(path):
            return _dump_source(path, prefix)
        if looks_like_debug_dir(path):
            debug = read_debug_dir(path)
            return DumpSource(path, debug.snapshot, debug.notes)
    except (FlightRecorderError, DebugDumpError) as error:
        raise RunDirError(str(error)) from None
    raise RunDirError(f"no readable probe file in {path}: neither a run dir (no *.probe files) "
                      f"nor a directory of Flight Recorder dumps, or no rank has started yet")


def _dump_source(path: str, prefix: str | None) -> DumpSource:
    run = read_fr_dir(path, prefix)
    notes = run.notes
    if looks_like_debug_dir(path):
        debug = read_debug_dir(path)
        for rank, state in run.snapshot.ranks.items():
            shown = debug.snapshot.ranks.get(rank)
            if shown is not None:
                state.stacks, state.frame = shown.stacks, state.frame or shown.frame
        notes.append(f"{debug.stacks_file}: each rank's stacks, from torch.distributed.debug")
    return DumpSource(path, run.snapshot, notes, run.group_names)


def _snapshot_source(path: str) -> SnapshotSource:
    try:
        body = json.loads(read_small(os.path.join(path, Document.SNAPSHOT), MAX_SNAPSHOT_BYTES))
        snapshot = snapshot_from_dict(read_version(Document.SNAPSHOT, body), path)
    except (OSError, ValueError) as error:
        raise RunDirError(f"cannot read {os.path.join(path, Document.SNAPSHOT)}: "
                          f"{getattr(error, 'strerror', None) or error}") from None
    return SnapshotSource(path, snapshot, snapshot.notes)


def _probe_source(path: str, first_read: bool) -> RunDirSource:
    """The run dir, read once here (a run dir of 16,384 ranks takes seconds to
    read) so that a dir that cannot be judged is refused at once; a caller that
    shows diag launch's own judgment meanwhile may leave that to its first read."""
    source = RunDirSource(path)
    if first_read or not os.path.exists(os.path.join(path, judged_file.NAME)):
        source.first = source.snapshot()
    return source


class LauncherSource(Source):
    """What a running `diag launch` last collected and concluded."""

    def __init__(self, launcher):
        super().__init__(launcher.opts.run_dir)
        self.launcher = launcher

    @property
    def notes(self) -> list[str]:
        return self.launcher.collector.notes

    def judged(self) -> Judged:
        """The launcher's last poll, published whole: never a snapshot of one poll
        with the verdicts of another."""
        return self.launcher.judged or Judged(Snapshot(time.time(), self.run_dir, {}))

    def command(self) -> list[str] | None:
        return self.launcher.opts.command
