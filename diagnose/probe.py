"""The probe inside every rank: identity, phases, collectives and a heartbeat,
published to the rank's file in the run dir (docs/run-dir.md).

Off unless DIAG_RUN_DIR is set when `init` runs; then every call below costs one
global check. When on, the process that calls `init` writes `rank-{R}.probe`
(the driver: `driver.probe`). Phases and collectives are meant to be entered by
one thread (the engine loop); the heartbeat thread reports that thread's frame
and writes `stacks-{R}.json` when the collector asks for a dump.

Two more files say how a rank ended, when it ended badly: `error-{R}.json`, the
exception that last left a phase (with its traceback, written before any
clean-up runs), and `fatal-{R}.txt`, every thread's Python stack on a fatal
signal such as the SIGABRT of NCCL's watchdog (faulthandler).
"""
from __future__ import annotations

import atexit
import faulthandler
import json
import os
import socket
import sys
import threading
import time
import traceback
from collections import deque

from diagnose import faults, rank_env, runfile, stacks

RUN_DIR_VAR = "DIAG_RUN_DIR"
HEARTBEAT_S = 0.1
TRACED_ENV = ("CUDA_LAUNCH_BLOCKING",)
COMMUNICATOR_FILE = os.path.join("engine", "communicator.py")
DIAGNOSE_DIR = os.path.dirname(__file__) + os.sep
FATAL_MAIN_THREAD = "diag: main thread"   # first line of fatal-{R}.txt, then the thread id


class _Off:
    """What phase(), collective() and the graph calls return while the probe is off."""
    skip = False
    calls = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_OFF = _Off()
_probe: _Probe | None = None


def init(role, rank=None, world_size=None, tp_rank=None, tp_size=None,
         pp_rank=None, pp_size=None, device="cpu", groups=None):
    """role "worker" or "process" needs a rank (for "process", RANK from the
    environment will do); "driver" has none. A second call is ignored."""
    global _probe
    run_dir = os.environ.get(RUN_DIR_VAR)
    if not run_dir or _probe is not None:
        return
    if role != "driver" and rank is None:
        if "RANK" not in os.environ:
            raise ValueError(f"probe.init(role={role!r}) needs a rank (or RANK in the environment)")
        rank = int(os.environ["RANK"])
    rank_env.apply(run_dir, None if role == "driver" else rank)
    identity = {
        "role": role, "rank": None if role == "driver" else rank, "world_size": world_size,
        "tp_rank": tp_rank, "tp_size": tp_size, "pp_rank": pp_rank, "pp_size": pp_size,
        "host": socket.gethostname(), "pid": os.getpid(), "device": str(device),
        "env": {key: value for key, value in os.environ.items()
                if key in TRACED_ENV or key.startswith("NCCL_")},
        "groups": groups or {},
    }
    _probe = _Probe(run_dir, identity)
    os.register_at_fork(after_in_child=_forget)


def _forget():
    """A forked child must not write into its parent's files; it may init its own."""
    global _probe
    if _probe is not None:
        faulthandler.disable()
    _probe = None


def is_on() -> bool:
    """Whether this process's probe was started (init ran with DIAG_RUN_DIR set)."""
    return _probe is not None


def phase(name, step=None):
    probe = _probe
    if probe is None:
        return _OFF
    return _Phase(probe, name, step)


def collective(group, op, tensors, peer=None):
    """Use only as `with probe.collective(...) as record`: the record is made here."""
    probe = _probe
    if probe is None:
        return _OFF
    return probe.begin_collective(group, op, tensors, peer, sys._getframe(1))


def graph_capture():
    """Use as `with probe.graph_capture() as graph:` around a CUDA graph's capture.
    The collectives called inside are not recorded then (the capture runs none);
    `with probe.graph_replay(graph):` around each replay records them all again."""
    probe = _probe
    if probe is None:
        return _OFF
    return _Capture(probe)


def graph_replay(graph):
    probe = _probe
    if probe is None or not graph.calls:
        return _OFF
    return _Replay(probe, graph.calls)


def kv_stats(step, used, free, allocated, freed, preempted):
    if _probe is not None:
        _probe.file.kv_stats(step, used, free, allocated, freed, preempted)


def ring_state(written):
    if _probe is not None:
        _probe.file.ring_written(written)


def ring_read(count):
    if _probe is not None:
        _probe.file.ring_read(count)


def worker_exit(rank, exitcode):
    if _probe is not None:
        _probe.file.worker_exit(rank, exitcode, time.time())


def error_file_name(rank: int | None) -> str:
    return "error-driver.json" if rank is None else f"error-{rank}.json"


def fatal_file_name(rank: int | None) -> str:
    return "fatal-driver.txt" if rank is None else f"fatal-{rank}.txt"


class _Phase:
    __slots__ = ("probe", "name", "step", "event")

    def __init__(self, probe, name, step):
        self.probe = probe
        self.name = name
        self.step = step

    def __enter__(self):
        self.event = self.probe.enter_phase(self.name, self.step)
        return self

    def __exit__(self, exc_type, exc, tb):
        self.probe.exit_phase(self.event)
        if exc_type is not None and issubclass(exc_type, Exception):
            self.probe.phase_error(exc, tb, self.name, self.step)
        return False


class _Traced:
    """A traced collective's record; the communicator makes the call when skip is False."""
    __slots__ = ("file", "event")
    skip = False

    def __init__(self, file, event):
        self.file = file
        self.event = event

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:  # a call that raised (a peer died, say) never completed
            self.file.complete_collective(self.event, time.time())
        return False


class _TracedOnDevice(_Traced):
    """A traced collective on a CUDA stream: events recorded before and after the
    call let the heartbeat thread see when the GPU reaches and finishes it."""
    __slots__ = ("probe", "start")

    def __init__(self, probe, event, start):
        super().__init__(probe.file, event)
        self.probe = probe
        self.start = start

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.file.complete_collective(self.event, time.time())
            self.probe.watch_device([(self.event, self.probe.file.coll_head)], self.start)
        return False


class _CapturedCall:
    """A collective called while a CUDA graph was captured, as each replay records it."""
    __slots__ = ("key", "group", "op", "peer", "shapes", "dtype", "nbytes", "site")

    def __init__(self, key, group, op, peer, shapes, dtype, nbytes, site):
        self.key, self.group, self.op, self.peer = key, group, op, peer
        self.shapes, self.dtype, self.nbytes, self.site = shapes, dtype, nbytes, site


class _Capture:
    """While a graph is captured the heartbeat thread queries no event: a CUDA call
    from another thread can invalidate a capture (in CUDA's global capture mode)."""
    __slots__ = ("probe", "calls")

    def __init__(self, probe):
        self.probe = probe
        self.calls: list[_CapturedCall] = []

    def __enter__(self):
        self.probe.device_lock.acquire()
        self.probe.capture = self
        return self

    def __exit__(self, *exc):
        self.probe.capture = None
        self.probe.device_lock.release()
        return False


class _Replay:
    """One replay of a captured graph. Its records are written after the replay is
    enqueued, while the GPU runs it; one event before and one after the replay
    stand for the device progress of all of them."""
    __slots__ = ("probe", "calls", "t_enqueue", "start")

    def __init__(self, probe, calls):
        self.probe = probe
        self.calls = calls

    def __enter__(self):
        self.t_enqueue = time.time()
        self.start = self.probe.record_event() if self.probe.on_device else None
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.probe.publish_replay(self.calls, self.t_enqueue, self.start)
        return False


class _InFlight:
    """Traced calls the GPU has not finished: (record offset, n) of each, and the
    events recorded before and after them."""
    __slots__ = ("records", "start", "end", "started")

    def __init__(self, records, start, end):
        self.records, self.start, self.end = records, start, end
        self.started = False


class _Skipped(_Off):
    skip = True


_SKIPPED = _Skipped()


class _Probe:
    def __init__(self, run_dir: str, identity: dict):
        import psutil  # only a probe that is on pays for the import
        rank = identity["rank"]
        self.run_dir = run_dir
        self.rank = rank
        os.makedirs(run_dir, exist_ok=True)
        self.file = runfile.RunFileWriter(
            os.path.join(run_dir, runfile.probe_file_name(rank)), identity, os.getpid(),
            psutil.Process().create_time(), time.time())
        self.fatal_sink = _on_fatal_signal(os.path.join(run_dir, fatal_file_name(rank)))
        self.last_error: BaseException | None = None  # the exception error-{R}.json holds
        specs = [spec for spec in faults.parse_faults(os.environ.get(faults.ENV_VAR, ""))
                 if spec.rank == rank]
        self.faults = faults.FaultPlan(specs)
        if specs:
            self.file.fault(str(specs[0]), 0.0)
        self.skip_next_collective = False
        self.depth = 0
        self.traced_thread = threading.get_ident()
        self.seqs: dict[tuple, int] = {}
        self.sites: dict[tuple[int, int], bytes] = {}
        self.codes: dict[int, tuple[object, bool]] = {}
        self.tensor_info: dict[tuple, tuple[bytes, bytes, int]] = {}
        self.capture: _Capture | None = None         # the CUDA graph being captured
        self.device = identity["device"]
        self.on_device = self.device.startswith("cuda")
        if self.on_device:
            self.capturing, self.new_event, self.set_device = _cuda_calls()
        self.in_flight: deque[_InFlight] = deque()   # main thread appends, heartbeat pops
        self.free_events: deque = deque()            # heartbeat returns, main thread takes
        self.device_lock = threading.Lock()          # the heartbeat's event queries, or a capture
        self.device_set = False
        threading.Thread(target=self._beat, name="diag-heartbeat", daemon=True).start()

    # Phases.

    def enter_phase(self, name: str, step: int | None) -> int:
        fault = self.faults.due(name, step) if self.faults.armed else None
        if fault is not None:
            self._fire(fault)
        if self.depth == 0:
            self.traced_thread = threading.get_ident()
        self.last_error = None   # written already; holding it would keep its frames alive
        self.depth += 1
        event = self.file.open_phase(name, step, time.time(), self.depth)
        if fault is not None and fault.kind == "skip_broadcast":
            faults.block_forever()
        return event

    def exit_phase(self, event: int) -> None:
        self.depth -= 1
        self.file.close_phase(event, time.time(), self.depth)

    def phase_error(self, error: BaseException, tb, name: str, step: int | None) -> None:
        """Writes error-{R}.json for an exception leaving a phase, once per exception
        (the innermost phase it leaves). It is written here, before the code that
        catches it cleans up: a CUDA error's clean-up may never end."""
        if error is self.last_error:
            return
        self.last_error = error
        caller = tb.tb_frame.f_back
        frames = (traceback.extract_stack(caller) if caller else []) + traceback.extract_tb(tb)
        body = {"pid": os.getpid(), "at": time.time(), "phase": name, "step": step,
                "error": traceback.format_exception_only(type(error), error)[-1].strip(),
                "frames": [[frame.filename, frame.lineno, frame.name, frame.line or ""]
                           for frame in frames]}
        path = os.path.join(self.run_dir, error_file_name(self.rank))
        try:
            with open(path, "w") as sink:
                json.dump(body, sink)
        except OSError:
            pass

    def _fire(self, fault: faults.FaultSpec) -> None:
        self.file.fault(str(fault), time.time())
        if fault.kind == "skip_collective":
            self.skip_next_collective = True
        faults.inflict(fault)

    # Collectives.

    def begin_collective(self, group, op, tensors, peer, caller) -> _Traced | _Off:
        if self.skip_next_collective:
            self.skip_next_collective = False
            return _SKIPPED
        key = (group, op, peer) if peer is not None else group
        shapes, dtype, nbytes = self._describe(tensors)
        site = self._call_site(caller)
        if self.capture is not None:
            self.capture.calls.append(_CapturedCall(key, group, op, peer, shapes, dtype,
                                                    nbytes, site))
            return _OFF
        seq = self.seqs.get(key, 0)
        self.seqs[key] = seq + 1
        on_device = self.on_device and tensors[0].is_cuda and not self.capturing()
        at = self.file.open_collective(group, seq, op, peer, shapes, dtype, nbytes, site,
                                       time.time(), on_device)
        if not on_device:
            return _Traced(self.file, at)
        return _TracedOnDevice(self, at, self.record_event())

    def publish_replay(self, calls: list[_CapturedCall], t_enqueue: float, start) -> None:
        """One record per captured call, with the next seq of its group, completed on
        the host (the replay is enqueued)."""
        end = self.record_event() if start is not None else None
        t_complete = time.time()
        records = []
        for call in calls:
            seq = self.seqs.get(call.key, 0)
            self.seqs[call.key] = seq + 1
            at = self.file.open_collective(call.group, seq, call.op, call.peer, call.shapes,
                                           call.dtype, call.nbytes, call.site, t_enqueue,
                                           start is not None, t_complete)
            records.append((at, self.file.coll_head))
        if end is not None:
            self.in_flight.append(_InFlight(records, start, end))

    def record_event(self):
        event = self.free_events.pop() if self.free_events else self.new_event()
        event.record()
        return event

    def watch_device(self, records: list[tuple[int, int]], start) -> None:
        self.in_flight.append(_InFlight(records, start, self.record_event()))

    def _describe(self, tensors) -> tuple[bytes, bytes, int]:
        """(shapes, dtypes, bytes), cached by the tensors' shapes and dtypes."""
        if len(tensors) == 1:
            key = (tensors[0].shape, tensors[0].dtype)
        else:
            key = tuple([(tensor.shape, tensor.dtype) for tensor in tensors])
        info = self.tensor_info.get(key)
        if info is None:
            dtypes = {str(tensor.dtype).removeprefix("torch.") for tensor in tensors}
            info = self.tensor_info[key] = (
                runfile.format_shapes([tuple(tensor.shape) for tensor in tensors]),
                ",".join(sorted(dtypes)).encode(),
                sum(tensor.numel() * tensor.element_size() for tensor in tensors))
        return info

    def _call_site(self, frame) -> bytes:
        """The first frame outside the communicator and diagnose/.

        Hashing a code object or asking a frame for its line number costs more
        than the rest of the record, so both caches go by id(code); `codes`
        keeps each code object alive, so an id is never reused for another.
        """
        while frame is not None:
            code = frame.f_code
            known = self.codes.get(id(code))
            if known is None:
                known = self.codes[id(code)] = (code, code.co_filename.endswith(COMMUNICATOR_FILE)
                                                or code.co_filename.startswith(DIAGNOSE_DIR))
            if not known[1]:
                break
            frame = frame.f_back
        if frame is None:
            return b""
        key = (id(code), frame.f_lasti)
        site = self.sites.get(key)
        if site is None:
            site = self.sites[key] = stacks.frame_label(
                code.co_filename, frame.f_lineno, code.co_name).encode()
        return site

    # Heartbeat thread.

    def _beat(self) -> None:
        me = threading.get_ident()
        count, answered = 0, 0
        while True:
            count += 1
            self.file.heartbeat(time.time(), count, self._traced_frame())
            if self.in_flight and self.device_lock.acquire(blocking=False):
                try:
                    self._poll_device()
                finally:
                    self.device_lock.release()
            request = self.file.dump_request()
            if request != answered:
                self._dump(request, me)
                answered = request
            time.sleep(HEARTBEAT_S)

    def _poll_device(self) -> None:
        """Marks the calls the GPU has reached and finished since the last beat.
        A stream runs its work in order, so the first unfinished call ends the scan."""
        now = time.time()
        try:
            if not self.device_set:   # events are queried from this thread: same device
                self.set_device(self.device)
                self.device_set = True
            self._forget_overwritten()
            while self.in_flight:
                call = self.in_flight[0]
                if not call.started:
                    if not call.start.query():
                        return
                    call.started = True
                    self._mark(call, False, now)
                if not call.end.query():
                    return
                self._mark(call, True, now)
                self.in_flight.popleft()
                self.free_events.extend((call.start, call.end))
        except RuntimeError:        # the CUDA context is broken (a device-side error)
            self.on_device = False
            self.in_flight.clear()

    def _forget_overwritten(self) -> None:
        """Calls whose records the ring no longer holds need no query: a busy rank
        makes thousands between two beats."""
        oldest_kept = self.file.coll_head - runfile.COLLECTIVE_CAPACITY
        while self.in_flight and self.in_flight[0].records[-1][1] <= oldest_kept:
            call = self.in_flight.popleft()
            self.free_events.extend((call.start, call.end))

    def _mark(self, call: _InFlight, done: bool, now: float) -> None:
        for at, n in call.records:
            self.file.device_progress(at, n, done, now)

    def _dump(self, request: int, me: int) -> None:
        """Answers even when the file cannot be written (run dir gone), so the
        asker stops waiting and the heartbeat thread lives on."""
        try:
            stacks.write_stacks_file(
                os.path.join(self.run_dir, runfile.stacks_file_name(self.rank)),
                stacks.thread_stacks(skip_ident=me), os.getpid(), request)
        except OSError:
            pass
        self.file.dump_done(request)

    def _traced_frame(self) -> str:
        frame = sys._current_frames().get(self.traced_thread)
        if frame is None:
            return ""
        return stacks.frame_label(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)


def _on_fatal_signal(path: str):
    """faulthandler writes every thread's stack to `path` on SIGABRT, SIGSEGV, SIGBUS,
    SIGFPE or SIGILL. The first line names the thread that called init (the
    engine's), whose stack shows where the host was. Returns the open file, which
    must stay open; None where the process had turned faulthandler on itself."""
    if faulthandler.is_enabled():
        return None
    sink = open(path, "w")
    sink.write(f"{FATAL_MAIN_THREAD} 0x{threading.get_ident():x}\n")
    sink.flush()
    faulthandler.enable(sink, all_threads=True)
    atexit.register(_drop_fatal_file, sink)
    return sink


def _drop_fatal_file(sink) -> None:
    """An interpreter that exits normally had no fatal signal: its file says nothing."""
    faulthandler.disable()
    sink.close()
    try:
        os.remove(sink.name)
    except OSError:
        pass


def _cuda_calls():
    """(is the stream capturing a graph, make an event, set the thread's device):
    torch is imported only by a probe that traces a CUDA device."""
    import torch
    return (torch.cuda.is_current_stream_capturing, torch.cuda.Event,
            lambda device: torch.cuda.set_device(torch.device(device)))
