"""Reads every probe file in a run dir into a Snapshot, many times a second.

A file that cannot be read is skipped with a note (Collector.notes), never an
exception; the notes the job's processes made (probe/notes.py) are there too; a rank whose file it is (rank-R.probe) is listed as unreadable, so
that the analysis knows whom its peers wait on. A file without which the run
cannot be judged rightly (driver.probe, exit.json, a node-N.json) that is
there but cannot be read is also listed in Collector.refused: `diag analyze`
refuses such a run dir rather than guess. Identities, decoded ring
records and stacks dumps are cached, so a steady read decodes only what
changed; snapshots therefore share record objects, which nobody may modify.
"""
from __future__ import annotations

import glob
import json
import os
import re
import socket
import stat
import time

import psutil

from diagnose.core import runfile
from diagnose.core.checked import checked
from diagnose.core.files import read_small
from diagnose.core.groups import GroupReader
from diagnose.core.schema import Document, NewerSchema, read_version
from diagnose.core.frames import frame_label
from diagnose.core.snapshot import (ActivitySample, CpuWait, FaultRecord, Identity, RaisedError,
                                    RankState, Snapshot, Stop, Stopping)
from diagnose.core.vocab import Role
from diagnose.launch import nodes
from diagnose.launch.cpuload import HostMeter, RunDelays
from diagnose.probe import notes as probe_notes
from diagnose.probe.stopping import STOPPING_FILE

EXIT_FILE = str(Document.EXIT)  # written by diag launch when the command ends
EXIT_FILE_BYTES = 4096
STACKS_FILE_BYTES = 16 << 20
SIDE_FILE_BYTES = 1 << 20      # a state or error file
HISTORY = 64             # records of each ring put in a snapshot (the whole ring)
REMOTE_ALIVE_S = 2.0     # a rank on another host counts as alive while its heartbeat is this fresh
SAME_PROCESS_S = 0.5     # create times closer than this are the same process, not pid reuse
RANK_FILE = re.compile(r"rank-(\d+)\.probe")


class Collector:
    """`hub`, on a multi-node head: the other nodes' ranks, which it holds; without
    it they are read from the run dir's node files."""

    def __init__(self, run_dir: str, history: int = HISTORY, hub: nodes.NodeHub | None = None):
        self.run_dir = run_dir
        self.history = history
        self.hub = hub
        self._node_files = nodes.NodeFiles()
        self.notes: list[str] = []       # the job's notes, and files the last snapshot skipped
        self.refused: list[str] = []     # those of them the run cannot be judged without
        self.unreadable: list[str] = []  # the probe files among them
        self._identities: dict[tuple, Identity] = {}
        self._groups = GroupReader()
        self._stacks: dict[str, tuple[int, dict | None]] = {}
        self._side: dict[str, tuple[int, object]] = {}  # state and error files, by mtime
        self._records: dict[str, dict] = {}    # path -> runfile.read_probe's cache
        self._beats: dict[str, tuple] = {}     # path -> (pid, create time, heartbeat count)
        self._frames: dict[str, tuple] = {}    # path -> (pid, frame, when it was first seen)
        self._processes: dict[tuple, bool] = {}  # (pid, create time) -> alive, in this snapshot
        self._local: set[tuple] = set()          # (pid, create time) of this host's live ones
        self._host = socket.gethostname()
        self._job_notes: tuple[tuple, list[str]] = ((), [])   # notes.jsonl's (size, mtime), notes
        self._run_delays = RunDelays()
        self._host_meter = HostMeter()

    def snapshot(self) -> Snapshot:
        self.notes, self.refused, self.unreadable = self._read_job_notes(), [], []
        self._processes, self._local = {}, set()
        ranks: dict[int, RankState] = {}
        unreadable: dict[int, str] = {}
        driver = None
        for path in sorted(glob.glob(os.path.join(self.run_dir, "*.probe"))):
            try:
                state = self._read(path)
            except runfile.ProbeFileError as error:
                note = f"{os.path.basename(path)}: {error}"
                self.notes.append(note)
                self.unreadable.append(note)
                named = RANK_FILE.fullmatch(os.path.basename(path))
                if named is not None:
                    unreadable[int(named.group(1))] = note
                elif os.path.basename(path) == runfile.probe_file_name(None):
                    self.refused.append(note)
                continue
            if state.identity.role == Role.DRIVER:
                driver = state
            elif state.identity.rank in ranks:
                self.notes.append(f"{os.path.basename(path)}: rank {state.identity.rank} "
                                  f"appears twice, skipped")
            else:
                ranks[state.identity.rank] = state
        command_exit, stop, ended_at = self._command_exit()
        stopping = self._stopping()            # after the probe files: it came before any death
        now = time.time()
        if command_exit is not None:
            now = min(now, ended_at or _last_sign_of_life(ranks, driver, now))
        self._run_delays.forget_others(self._local)
        snapshot = Snapshot(taken_at=now, run_dir=self.run_dir,
                            ranks=dict(sorted(ranks.items())), driver=driver,
                            command_exit=command_exit, stop=stop, stopping=stopping,
                            unreadable=unreadable,
                            host=None if command_exit is not None else self._host_meter.read())
        if self.hub is not None:
            known = self.hub.nodes()
        else:                                             # a multi-node head's run dir
            known, notes, refused = self._node_files.read(self.run_dir)
            self.notes += notes + refused
            self.refused += refused
        return nodes.merge(snapshot, known, self.notes) if known else snapshot

    def _read_job_notes(self) -> list[str]:
        """The job's notes; read again only when the file changed."""
        try:
            info = os.stat(os.path.join(self.run_dir, probe_notes.NOTES_FILE))
            key = (info.st_size, info.st_mtime_ns)
        except OSError:
            return []
        if key != self._job_notes[0]:
            self._job_notes = key, probe_notes.read(self.run_dir)
        return list(self._job_notes[1])

    def _command_exit(self) -> tuple[int | None, Stop | None, float | None]:
        """The wrapped command's exit code, once `diag launch` has seen it end, the
        stop, if diag launch stopped it, and when it ended (run dirs of diag 0.x
        before ended_at have no time)."""
        ending = self._small_file(EXIT_FILE, Document.EXIT, "diag launch", _exit_of)
        return ending or (None, None, None)

    def _stopping(self) -> Stopping | None:
        """When the command began to stop the job itself (probe/stopping.py)."""
        return self._small_file(STOPPING_FILE, Document.STOPPING, "diag's probe",
                                lambda body: checked(Stopping, body))

    def _small_file(self, name: str, document: Document, writer: str, parse):
        """parse() of the run dir's JSON file `name`; None where there is none, or
        where it is refused, which the notes say."""
        try:
            body = read_version(document, json.loads(read_small(
                os.path.join(self.run_dir, name), EXIT_FILE_BYTES)))
            return parse(body)
        except FileNotFoundError:
            return None
        except OSError as error:
            problem = error.strerror
        except (NewerSchema, NoExitCode) as error:
            problem = str(error)
        except (ValueError, KeyError, TypeError, RecursionError) as error:
            problem = f"not the JSON {writer} writes ({type(error).__name__})"
        self.notes.append(f"{name}: {problem}")
        self.refused.append(f"{name}: {problem}")
        return None

    def _read(self, path: str) -> RankState:
        """The rank's state, or ProbeFileError. The file is opened without blocking
        and must be a regular one: a FIFO named like a probe file would block a
        plain open until someone writes to it."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as error:
            raise runfile.ProbeFileError(error.strerror) from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise runfile.ProbeFileError("not a regular file")
            data = runfile.read_probe(fd, self.history, self._records.setdefault(path, {}))
            identity = self._identity(path, fd, data.header)
        except OSError as error:
            raise runfile.ProbeFileError(error.strerror) from None
        finally:
            os.close(fd)
        alive = self._alive(path, identity, data)
        return RankState(
            identity=identity, started_at=data.header.started_at,
            heartbeat_at=data.heartbeat_at, alive=alive,
            open_phases=data.open_phases, frame=data.frame, phases=data.phases,
            collectives=data.collectives, kv=data.kv, ring_read=data.ring_read,
            ring_written=data.ring_written,
            fault=FaultRecord(data.fault_spec, data.fault_fired_at) if data.fault_spec else None,
            worker_exits=data.worker_exits,
            stacks=self._read_stacks(identity), frame_moved_at=self._frame_moved(path, data),
            device_done_at=data.device_done_at, device_pending=data.device_pending,
            activity=None if identity.rank is None else self._side_file(
                runfile.state_file_name(identity.rank), read_state_file, identity.pid),
            error=self._side_file(runfile.error_file_name(identity.rank), read_error_file,
                                  identity.pid),
            cpu_waits=self._cpu_waits(identity, data.header) if alive else [])

    def _cpu_waits(self, identity: Identity, header: runfile.Header) -> list[CpuWait]:
        """The process's run-delay history, where it runs on this host."""
        if identity.host != self._host:
            return []
        key = (header.pid, header.create_time)
        if key in self._local:          # read already in this snapshot (synthetic runs share one)
            return self._run_delays.shown(key)
        self._local.add(key)
        return self._run_delays.history(*key)

    def _identity(self, path: str, fd: int, header: runfile.Header) -> Identity:
        key = (path, header.pid, header.create_time, header.started_at)
        identity = self._identities.get(key)
        if identity is None:
            fields = runfile.read_identity(fd, header)
            try:
                groups = self._groups.read(fields.pop("groups", {}))
                identity = checked(Identity, fields)
                identity.groups = groups
            except ValueError as error:
                raise runfile.ProbeFileError(f"identity fields: {error}") from None
            if identity.role != Role.DRIVER and not isinstance(identity.rank, int):
                raise runfile.ProbeFileError(f"identity has no rank (role {identity.role!r})")
            self._identities[key] = identity
        return identity

    def _alive(self, path: str, identity: Identity, data: runfile.ProbeData) -> bool:
        """A heartbeat that moved since the last snapshot proves the process
        lived a moment ago; only a still heartbeat costs a look at the process."""
        beat = (data.header.pid, data.header.create_time, data.heartbeat_count)
        last = self._beats.get(path)
        self._beats[path] = beat
        if last is not None and last[:2] == beat[:2] and last[2] < beat[2]:
            return True
        if identity.host != self._host:
            return time.time() - data.heartbeat_at < REMOTE_ALIVE_S
        process = (data.header.pid, data.header.create_time)
        if process not in self._processes:
            self._processes[process] = pid_alive(*process)
        return self._processes[process]

    def _frame_moved(self, path: str, data: runfile.ProbeData) -> float | None:
        """When this collector saw the main thread's frame change last: a process
        that compiles or loads keeps moving; a blocked one sits on one frame."""
        seen = self._frames.get(path)
        if seen is not None and seen[:2] == (data.header.pid, data.frame):
            return seen[2]
        moved = data.heartbeat_at if seen is not None and seen[0] == data.header.pid else None
        self._frames[path] = (data.header.pid, data.frame, moved)
        return moved

    def _side_file(self, name: str, read, pid: int):
        """read(path, pid) of a small file beside the probe's, again only when it changed."""
        path = os.path.join(self.run_dir, name)
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            return None
        cached = self._side.get(path)
        if cached is None or cached[0] != mtime:
            cached = self._side[path] = (mtime, read(path, pid))
        return cached[1]

    def _read_stacks(self, identity: Identity) -> dict | None:
        """The rank's last stacks dump, if this process (its pid) wrote it."""
        path = os.path.join(self.run_dir, runfile.stacks_file_name(identity.rank))
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            return None
        cached = self._stacks.get(path)
        if cached is None or cached[0] != mtime:
            cached = self._stacks[path] = (mtime, read_stacks_file(path, identity.pid))
        return cached[1]


def _last_sign_of_life(ranks: dict[int, RankState], driver: RankState | None,
                       now: float) -> float:
    """When a finished job last showed life. A run dir read hours later is judged
    as it stood then, not as if its ranks had stalled since."""
    return max((state.last_sign_of_life for state in [*ranks.values(), driver]
                if state is not None), default=now)


def pid_alive(pid: int, create_time: float) -> bool:
    """The process runs, is not a zombie, and is the one that wrote the file."""
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            return (process.status() != psutil.STATUS_ZOMBIE
                    and abs(process.create_time() - create_time) < SAME_PROCESS_S)
    except psutil.Error:
        return False


def read_stacks_file(path: str, pid: int) -> dict[str, list[str]] | None:
    """{thread: frames} from a probe's dump; None if missing, unreadable or another pid's."""
    try:
        dump = read_version(Document.STACKS, json.loads(read_small(path, STACKS_FILE_BYTES)))
        threads = dump["threads"] if dump.get("pid") == pid else None
    except (OSError, ValueError, KeyError, AttributeError, TypeError, RecursionError):
        return None
    if not isinstance(threads, dict) or not all(
            isinstance(frames, list) and all(isinstance(frame, str) for frame in frames)
            for frames in threads.values()):
        return None
    return {str(name): frames for name, frames in threads.items()}


def read_state_file(path: str, pid: int) -> ActivitySample | None:
    """diag launch's last sample of the rank; None if missing, malformed or another pid's."""
    try:
        body = read_version(Document.STATE, json.loads(read_small(path, SIDE_FILE_BYTES)))
        sample = checked(ActivitySample, body)
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    return sample if sample.pid == pid else None


def read_error_file(path: str, pid: int) -> RaisedError | None:
    """The first exception that left a phase of this process; None if missing,
    malformed or another pid's. Files of an older probe have no `frame`: the
    innermost frame of the traceback stands for it."""
    try:
        body = read_version(Document.ERROR, json.loads(read_small(path, SIDE_FILE_BYTES)))
        frames = body["frames"]
        frame = body.get("frame") or (frame_label(*frames[-1][:2], frames[-1][2])
                                      if frames else None)
        error = checked(RaisedError, {"pid": body["pid"], "at": body["at"],
                                      "phase": body["phase"], "step": body["step"],
                                      "error": body["error"], "frame": frame})
    except (OSError, ValueError, KeyError, TypeError, IndexError, RecursionError):
        return None
    return error if error.pid == pid else None


def request_dump(run_dir: str, wait_s: float = 2.0) -> list[str]:
    """Asks every live rank for a stacks dump and waits for the answers.

    Returns one note per rank that did not answer (dead, unreadable, or its
    heartbeat thread could not run in time); their stacks need py-spy.
    """
    missing, waiting = [], {}
    for path in sorted(glob.glob(os.path.join(run_dir, "*.probe"))):
        name = os.path.basename(path)
        try:
            header = runfile.header_of(path)
            if not pid_alive(header.pid, header.create_time):
                missing.append(f"{name}: process {header.pid} is not running")
                continue
            waiting[path] = runfile.request_dump(path)
        except (OSError, runfile.ProbeFileError) as error:
            missing.append(f"{name}: {error}")
    deadline = time.monotonic() + wait_s
    while waiting and time.monotonic() < deadline:
        time.sleep(0.02)
        waiting = {path: request for path, request in waiting.items()
                   if runfile.dump_done(path) < request}
    missing += [f"{os.path.basename(path)}: no dump within {wait_s:g}s" for path in waiting]
    return missing


class NoExitCode(ValueError):
    """exit.json names no exit code."""


def _exit_of(ending: dict) -> tuple[int, Stop | None, float | None]:
    """exit.json's exit code, stop and end time (NoExitCode without a code)."""
    code, stop = ending["command_exit"], ending.get("stop")
    if code is None and stop is not None:  # diag stopped it: the job is over all the same
        code = ending.get("exit_after_stop")
    if not isinstance(code, int) or isinstance(code, bool):
        raise NoExitCode(f"command_exit {str(code)[:40]} is no exit code")
    ended_at = ending.get("ended_at")
    if not isinstance(ended_at, (int, float)) or isinstance(ended_at, bool):
        ended_at = None
    return code, None if stop is None else checked(Stop, stop), ended_at
