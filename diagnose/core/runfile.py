"""One rank's probe file in the run dir: a fixed binary layout (docs/run-dir.md)
that the probe writes through mmap and the collector reads from outside, while
the rank runs and after it died.

The file is built under a hidden name and renamed into place, so a reader never
sees a half-made header. Ring records carry their event number at both ends; a
reader keeps a record only when both ends agree with the number it expects, so
a torn or overwritten record is dropped, never misread.
"""
from __future__ import annotations

import json
import math
import mmap
import os
import struct
from dataclasses import dataclass

from diagnose.core.snapshot import CollectiveRecord, DeviceWork, KVStats, PhaseEvent, WorkerExit

MAGIC = b"DIAGPRB\x00"
VERSION = 2

NO_STEP = -(2 ** 63)        # step=None
NO_PEER = -1                # peer=None
NO_EXITCODE = -(2 ** 31)    # exitcode=None

PHASE_CAPACITY = 64
COLLECTIVE_CAPACITY = 64
OPEN_STACK_DEPTH = 8
EXITS_CAPACITY = 32
HEARTBEAT_S = 0.1           # the writer's heartbeat period
MAX_IDENTITY = 1 << 20      # identity JSON bytes a reader takes: groups of a large job fit
MAX_PID = 2 ** 31 - 1
FATAL_MAIN_THREAD = "diag: main thread"

# Header, at offset 0 (128 bytes reserved).
HEADER = struct.Struct("<8sIIqdd8I")
HEADER_SIZE = 128
# The GPU's progress through the step phases' work, in the header's spare
# bytes (files written before it have zeros there: nothing known).
DEVICE_WORK = struct.Struct("<ddq32s")       # done_at, pending_since, pending_step, pending_phase
DEVICE_WORK_AT = HEADER.size

# Live fields, at offset LIVE (see docs/run-dir.md for each offset).
LIVE = HEADER_SIZE
HEARTBEAT = struct.Struct("<dQ")            # heartbeat_at, heartbeat_count
HEARTBEAT_AT = LIVE + 0
PHASE_HEAD = struct.Struct("<QQ")           # phase_head, open_depth
PHASE_HEAD_AT = LIVE + 16
COUNTER = struct.Struct("<Q")
OPEN_DEPTH_AT = LIVE + 24
COLL_HEAD_AT = LIVE + 32
RING_WRITTEN_AT = LIVE + 40
RING_READ_AT = LIVE + 48
DUMP_REQUEST_AT = LIVE + 56
DUMP_DONE_AT = LIVE + 64
EXITS_COUNT_AT = LIVE + 72
FAULT = struct.Struct("<d96s")              # fired_at (0: armed, not fired), spec
FAULT_AT = LIVE + 80
KV = struct.Struct("<6q")  # step (NO_STEP: none), used, free, allocated, freed, preempted
KV_AT = LIVE + 184
FRAME = struct.Struct("<160s")
FRAME_AT = LIVE + 232
OPEN_ENTRY = struct.Struct("<32sqd")        # name, step, start
OPEN_STACK_AT = LIVE + 392
EXIT_ENTRY = struct.Struct("<iid")          # rank, exitcode, at
EXITS_AT = OPEN_STACK_AT + OPEN_STACK_DEPTH * OPEN_ENTRY.size
LIVE_SIZE = EXITS_AT + EXITS_CAPACITY * EXIT_ENTRY.size - LIVE
LIVE_FIELDS = struct.Struct("<dQQQQQQQQQd96s6q160s")  # everything up to the open stack

# Ring records. Event number n (1, 2, ...) lives in slot (n - 1) % capacity.
PHASE_RECORD = struct.Struct("<Qqdd32sQ")    # n, step, start, end (0: open), name, n
PHASE_RECORD_SIZE = PHASE_RECORD.size
PHASE_END_OFFSET = 24
PHASE_END = struct.Struct("<d")
COLL_RECORD = struct.Struct("<Qqqdd BB2xi 16s16s16s64s80s dd Q")
# n, seq, nbytes, t_enqueue, t_complete, state, device, peer, group, op, dtype, shapes, site,
# t_device_start, t_device_done, n
COLL_RECORD_SIZE = COLL_RECORD.size
COLL_DONE_OFFSET = 32
COLL_DONE = struct.Struct("<dB")             # t_complete, state
ENQUEUED, COMPLETED = 0, 1
COLL_N = struct.Struct("<Q")
DEVICE_TIME = struct.Struct("<d")
DEVICE_START_OFFSET, DEVICE_DONE_OFFSET = 240, 248

PHASE_RING_AT = LIVE + LIVE_SIZE
COLL_RING_AT = PHASE_RING_AT + PHASE_CAPACITY * PHASE_RECORD_SIZE
IDENTITY_AT = COLL_RING_AT + COLLECTIVE_CAPACITY * COLL_RECORD_SIZE


class ProbeFileError(Exception):
    """A probe file that cannot be read: too short, wrong magic or version, or
    values no writer writes (a pid of -1, a time that is not finite)."""


def probe_file_name(rank: int | None) -> str:
    return "driver.probe" if rank is None else f"rank-{rank}.probe"


def stacks_file_name(rank: int | None) -> str:
    return "stacks-driver.json" if rank is None else f"stacks-{rank}.json"


def error_file_name(rank: int | None) -> str:
    """The first exception that left a phase of the rank (JSON)."""
    return "error-driver.json" if rank is None else f"error-{rank}.json"


def state_file_name(rank: int) -> str:
    """What diag launch last saw the rank do (JSON, written by the launcher)."""
    return f"state-{rank}.json"


def fatal_file_name(rank: int | None) -> str:
    """Every thread's stack at a fatal signal (faulthandler's text, after a first
    line of FATAL_MAIN_THREAD and the engine thread's id)."""
    return "fatal-driver.txt" if rank is None else f"fatal-{rank}.txt"


def _text(raw: bytes) -> str:
    return raw.rstrip(b"\0").decode("utf-8", "replace")


def _step(value: int) -> int | None:
    return None if value == NO_STEP else value


class RunFileWriter:
    """The probe's side: creates the file, then updates it in place."""

    def __init__(self, path: str, identity: dict, pid: int, create_time: float,
                 started_at: float):
        body = json.dumps(identity).encode()
        size = IDENTITY_AT + len(body)
        tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, size)
            self.mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.mm[IDENTITY_AT:size] = body
        KV.pack_into(self.mm, KV_AT, NO_STEP, 0, 0, 0, 0, 0)
        HEADER.pack_into(self.mm, 0, MAGIC, VERSION, size, pid, create_time, started_at,
                         LIVE, PHASE_RING_AT, PHASE_CAPACITY, COLL_RING_AT,
                         COLLECTIVE_CAPACITY, IDENTITY_AT, len(body), 0)
        os.replace(tmp, path)
        self.phase_head = 0
        self.coll_head = 0
        self.exits = 0

    # Main thread, hot path.

    def open_phase(self, name: str, step: int | None, start: float, depth: int) -> int:
        """Writes the event and the open-stack entry at `depth` (1 = outermost)."""
        n = self.phase_head = self.phase_head + 1
        raw_name = name.encode()
        raw_step = NO_STEP if step is None else step
        at = PHASE_RING_AT + (n - 1) % PHASE_CAPACITY * PHASE_RECORD_SIZE
        PHASE_RECORD.pack_into(self.mm, at, n, raw_step, start, 0.0, raw_name, n)
        if depth <= OPEN_STACK_DEPTH:
            OPEN_ENTRY.pack_into(self.mm, OPEN_STACK_AT + (depth - 1) * OPEN_ENTRY.size,
                                 raw_name, raw_step, start)
        PHASE_HEAD.pack_into(self.mm, PHASE_HEAD_AT, n, depth)
        return n

    def close_phase(self, n: int, end: float, depth: int) -> None:
        """Ends event n (unless the ring moved past it); `depth` is what stays open."""
        if self.phase_head - n < PHASE_CAPACITY:
            PHASE_END.pack_into(self.mm, PHASE_RING_AT + (n - 1) % PHASE_CAPACITY
                                * PHASE_RECORD_SIZE + PHASE_END_OFFSET, end)
        COUNTER.pack_into(self.mm, OPEN_DEPTH_AT, depth)

    def open_collective(self, group: str, seq: int, op: str, peer: int | None, shapes: bytes,
                        dtype: bytes, nbytes: int, site: bytes, t_enqueue: float,
                        device: bool = False, t_complete: float = 0.0) -> int:
        """Returns the record's offset, the handle complete_collective and
        device_progress take. With t_complete the record is written completed
        (a CUDA graph replay's calls, recorded once the replay is enqueued)."""
        n = self.coll_head = self.coll_head + 1
        at = COLL_RING_AT + (n - 1) % COLLECTIVE_CAPACITY * COLL_RECORD_SIZE
        COLL_RECORD.pack_into(self.mm, at, n, seq, nbytes, t_enqueue, t_complete,
                              COMPLETED if t_complete else ENQUEUED, device,
                              NO_PEER if peer is None else peer, group.encode(), op.encode(),
                              dtype, shapes, site, 0.0, 0.0, n)
        COUNTER.pack_into(self.mm, COLL_HEAD_AT, n)
        return at

    def complete_collective(self, at: int, t_complete: float) -> None:
        """One thread makes one collective at a time, so the record is still in
        its slot: the next one is written only after this one completes."""
        COLL_DONE.pack_into(self.mm, at + COLL_DONE_OFFSET, t_complete, COMPLETED)

    # Heartbeat thread: the GPU's progress through traced calls.

    def device_progress(self, at: int, n: int, done: bool, t: float) -> None:
        """Marks record n (at offset `at`) reached (done=False) or finished on the
        device, unless a newer record has taken its slot."""
        if COLL_N.unpack_from(self.mm, at)[0] == n:
            DEVICE_TIME.pack_into(self.mm, at + (DEVICE_DONE_OFFSET if done else DEVICE_START_OFFSET), t)

    # Occasional updates.

    def kv_stats(self, step, used, free, allocated, freed, preempted) -> None:
        KV.pack_into(self.mm, KV_AT, step, used, free, allocated, freed, preempted)

    def ring_written(self, count: int) -> None:
        COUNTER.pack_into(self.mm, RING_WRITTEN_AT, count)

    def ring_read(self, count: int) -> None:
        COUNTER.pack_into(self.mm, RING_READ_AT, count)

    def fault(self, spec: str, fired_at: float) -> None:
        FAULT.pack_into(self.mm, FAULT_AT, fired_at, spec.encode())

    def worker_exit(self, rank: int, exitcode: int | None, at: float) -> None:
        EXIT_ENTRY.pack_into(self.mm, EXITS_AT + self.exits % EXITS_CAPACITY * EXIT_ENTRY.size,
                             rank, NO_EXITCODE if exitcode is None else exitcode, at)
        self.exits += 1
        COUNTER.pack_into(self.mm, EXITS_COUNT_AT, self.exits)

    # Heartbeat thread.

    def heartbeat(self, now: float, count: int, frame: str) -> None:
        FRAME.pack_into(self.mm, FRAME_AT, frame.encode())
        HEARTBEAT.pack_into(self.mm, HEARTBEAT_AT, now, count)

    def device_work(self, done_at: float, pending: DeviceWork | None) -> None:
        """When the GPU last finished a step phase's work, and the oldest work it
        has not finished (the phase the host left, its step, when it left)."""
        if pending is None:
            DEVICE_WORK.pack_into(self.mm, DEVICE_WORK_AT, done_at, 0.0, NO_STEP, b"")
        else:
            DEVICE_WORK.pack_into(self.mm, DEVICE_WORK_AT, done_at, pending.host_left_at,
                                  NO_STEP if pending.step is None else pending.step,
                                  pending.phase.encode())

    def dump_request(self) -> int:
        return COUNTER.unpack_from(self.mm, DUMP_REQUEST_AT)[0]

    def dump_done(self, request: int) -> None:
        COUNTER.pack_into(self.mm, DUMP_DONE_AT, request)


@dataclass
class Header:
    pid: int
    create_time: float
    started_at: float
    size: int
    identity_length: int


@dataclass
class ProbeData:
    """What one read of a probe file gives (identity is read separately)."""
    header: Header
    heartbeat_at: float
    heartbeat_count: int
    open_phases: list[PhaseEvent]
    frame: str
    phases: list[PhaseEvent]
    collectives: list[CollectiveRecord]
    kv: KVStats | None
    ring_written: int
    ring_read: int
    dump_request: int
    dump_done: int
    fault_spec: str
    fault_fired_at: float | None
    worker_exits: list[WorkerExit]
    device_done_at: float | None = None
    device_pending: DeviceWork | None = None


def read_header(raw: bytes) -> Header:
    if len(raw) < HEADER.size:
        raise ProbeFileError(f"truncated: {len(raw)} bytes, the header needs {HEADER.size}")
    (magic, version, size, pid, create_time, started_at, live, phase_at, phase_cap,
     coll_at, coll_cap, identity_at, identity_length, _) = HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise ProbeFileError(f"not a probe file (magic {magic!r})")
    if version != VERSION:
        raise ProbeFileError(f"layout version {version}, this reader knows {VERSION}")
    if (live, phase_at, phase_cap, coll_at, coll_cap, identity_at) != (
            LIVE, PHASE_RING_AT, PHASE_CAPACITY, COLL_RING_AT, COLLECTIVE_CAPACITY, IDENTITY_AT):
        raise ProbeFileError(f"layout fields do not match version {VERSION}")
    if size != IDENTITY_AT + identity_length:
        raise ProbeFileError(f"header says {size} bytes but identity ends at "
                             f"{IDENTITY_AT + identity_length}")
    if identity_length > MAX_IDENTITY:
        raise ProbeFileError(f"identity of {identity_length} bytes, over the {MAX_IDENTITY} "
                             f"a reader takes")
    if not 0 < pid <= MAX_PID:
        raise ProbeFileError(f"pid {pid} is no process's")
    if not (math.isfinite(create_time) and math.isfinite(started_at)):
        raise ProbeFileError("start times are not finite")
    return Header(pid, create_time, started_at, size, identity_length)


def read_probe(fd: int, history: int, cache: dict | None = None) -> ProbeData:
    """Reads the header, live fields and the last `history` records of each ring.

    `cache` (raw record bytes -> decoded record), kept by the caller from one
    read of a file to the next, spares decoding the records that did not change.
    """
    raw = os.pread(fd, IDENTITY_AT, 0)
    header = read_header(raw)
    if len(raw) < IDENTITY_AT:
        raise ProbeFileError(f"truncated: {len(raw)} bytes of {header.size}")
    (heartbeat_at, heartbeat_count, phase_head, depth, coll_head, ring_written, ring_read,
     dump_request, dump_done, exits_count, fired_at, fault_spec, kv_step, used, free,
     allocated, freed, preempted, frame) = LIVE_FIELDS.unpack_from(raw, LIVE)
    if not math.isfinite(heartbeat_at):
        raise ProbeFileError("heartbeat time is not finite")
    open_phases = [PhaseEvent(_text(name), _step(step), start, None)
                   for name, step, start in OPEN_ENTRY.iter_unpack(
                       raw[OPEN_STACK_AT:OPEN_STACK_AT + min(depth, OPEN_STACK_DEPTH)
                           * OPEN_ENTRY.size]) if math.isfinite(start)]
    known = {} if cache is None else cache
    fresh = {}
    phases = _read_ring(raw, PHASE_RING_AT, PHASE_RECORD_SIZE, PHASE_CAPACITY, phase_head,
                        history, _phase_event, known, fresh)
    collectives = _read_ring(raw, COLL_RING_AT, COLL_RECORD_SIZE, COLLECTIVE_CAPACITY, coll_head,
                             history, _collective_record, known, fresh)
    if cache is not None:
        cache.clear()
        cache.update(fresh)
    return ProbeData(
        header=header, heartbeat_at=heartbeat_at, heartbeat_count=heartbeat_count,
        open_phases=open_phases, frame=_text(frame),
        phases=phases, collectives=collectives,
        kv=None if kv_step == NO_STEP else KVStats(kv_step, used, free, allocated, freed,
                                                   preempted),
        ring_written=ring_written, ring_read=ring_read,
        dump_request=dump_request, dump_done=dump_done,
        fault_spec=_text(fault_spec),
        fault_fired_at=fired_at if fired_at and math.isfinite(fired_at) else None,
        worker_exits=_read_exits(raw, exits_count), **_device_work(raw))


def _device_work(raw: bytes) -> dict:
    done_at, since, step, phase = DEVICE_WORK.unpack_from(raw, DEVICE_WORK_AT)
    pending = (DeviceWork(_text(phase), _step(step), since)
               if since > 0 and math.isfinite(since) else None)
    return {"device_done_at": done_at if done_at > 0 and math.isfinite(done_at) else None,
            "device_pending": pending}


def read_identity(fd: int, header: Header) -> dict:
    raw = os.pread(fd, header.identity_length, IDENTITY_AT)
    if len(raw) < header.identity_length:
        raise ProbeFileError(f"truncated: identity has {len(raw)} of "
                             f"{header.identity_length} bytes")
    try:
        identity = json.loads(raw)
    except (ValueError, RecursionError) as error:
        raise ProbeFileError(f"identity is not JSON: {error}") from None
    if not isinstance(identity, dict):
        raise ProbeFileError("identity is not a JSON object")
    return identity


def _read_ring(raw: bytes, ring_at: int, size: int, capacity: int, head: int, history: int,
               decode, known: dict, fresh: dict) -> list:
    records = []
    for n in range(max(1, head - min(history, capacity) + 1), head + 1):
        at = ring_at + (n - 1) % capacity * size
        chunk = raw[at:at + size]
        record = known[chunk] if chunk in known else decode(chunk, n)
        fresh[chunk] = record
        if record is not None:
            records.append(record)
    return records


def _phase_event(chunk: bytes, n: int) -> PhaseEvent | None:
    first, step, start, end, name, last = PHASE_RECORD.unpack(chunk)
    if not first == last == n or not (math.isfinite(start) and math.isfinite(end)):
        return None
    return PhaseEvent(_text(name), _step(step), start, end or None)


def _collective_record(chunk: bytes, n: int) -> CollectiveRecord | None:
    (first, seq, nbytes, t_enqueue, t_complete, state, device, peer, group, op, dtype, shapes,
     site, t_device_start, t_device_done, last) = COLL_RECORD.unpack(chunk)
    if not first == last == n or not all(map(math.isfinite, (
            t_enqueue, t_complete, t_device_start, t_device_done))):
        return None
    done = state == COMPLETED
    return CollectiveRecord(
        group=_text(group), seq=seq, op=_text(op), peer=None if peer == NO_PEER else peer,
        shapes=parse_shapes(_text(shapes)), dtype=_text(dtype), nbytes=nbytes,
        site=_text(site), state="completed" if done else "enqueued", t_enqueue=t_enqueue,
        t_complete=t_complete if done else None, device=bool(device),
        t_device_start=t_device_start or None, t_device_done=t_device_done or None)


def _read_exits(raw: bytes, count: int) -> list[WorkerExit]:
    exits = []
    for i in range(max(0, count - EXITS_CAPACITY), count):
        rank, exitcode, at = EXIT_ENTRY.unpack_from(raw, EXITS_AT + i % EXITS_CAPACITY
                                                    * EXIT_ENTRY.size)
        if math.isfinite(at):
            exits.append(WorkerExit(rank, None if exitcode == NO_EXITCODE else exitcode, at))
    return exits


def format_shapes(shapes: list[tuple[int, ...]]) -> bytes:
    """[(4, 4096), (3,)] -> b"4x4096,3"; a 0-dim tensor is the empty string."""
    return ",".join("x".join(map(str, shape)) for shape in shapes).encode()


def parse_shapes(text: str) -> list[list[int]]:
    if not text:
        return []
    try:
        return [[int(dim) for dim in shape.split("x")] if shape else []
                for shape in text.split(",")]
    except ValueError:
        return []


def header_of(path: str) -> Header:
    with open(path, "rb") as source:
        return read_header(source.read(HEADER.size))


def request_dump(path: str) -> int:
    """Asks the rank behind `path` for a stacks dump; returns the request number."""
    fd = os.open(path, os.O_RDWR)
    try:
        read_header(os.pread(fd, HEADER.size, 0))
        request = COUNTER.unpack(os.pread(fd, COUNTER.size, DUMP_REQUEST_AT))[0] + 1
        os.pwrite(fd, COUNTER.pack(request), DUMP_REQUEST_AT)
        return request
    finally:
        os.close(fd)


def dump_done(path: str) -> int:
    """The last dump request the rank answered."""
    with open(path, "rb") as source:
        source.seek(DUMP_DONE_AT)
        return COUNTER.unpack(source.read(COUNTER.size))[0]
