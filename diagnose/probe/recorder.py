"""The probe of a rank once it is on: it writes phases and collectives to the
rank's file, watches the GPU reach and finish traced calls and the work of
each step phase, and runs the heartbeat thread that publishes the main
thread's frame and answers dump requests."""
from __future__ import annotations

import atexit
import faulthandler
import json
import os
import sys
import threading
import time
import traceback
from collections import deque

from diagnose.core import runfile
from diagnose.core.frames import frame_label
from diagnose.core.schema import Document, stamped
from diagnose.core.snapshot import DeviceWork
from diagnose.core.vocab import STEP_PHASES, Phase
from diagnose.probe import faults, fr_dump, stacks
from diagnose.probe.calls import (OFF, SKIPPED, Capture, CapturedCall, InFlight, Off, StepWork,
                                  Traced, TracedOnDevice)

COMMUNICATOR_FILE = os.path.join("engine", "communicator.py")
DIAGNOSE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
STDLIB_DIR = os.path.dirname(os.__file__) + os.sep
TORCH_DIR = os.sep + os.path.join("site-packages", "torch") + os.sep
# The phases whose GPU work is watched: a single GPU's progress shows in no
# collective, so one CUDA event as the host leaves each of them stands for it.
DEVICE_PHASES = frozenset(STEP_PHASES) - {Phase.DEQUEUE}
MAX_STEP_WORK = 1024            # unfinished phases watched; past it, newer ones are not


class Recorder:
    def __init__(self, run_dir: str, identity: dict):
        import psutil  # only a probe that is on pays for the import
        rank = identity["rank"]
        self.run_dir = run_dir
        self.rank = rank
        os.makedirs(run_dir, exist_ok=True)
        self.file = runfile.RunFileWriter(
            os.path.join(run_dir, runfile.probe_file_name(rank)), identity, os.getpid(),
            psutil.Process().create_time(), time.time())
        self.fatal_sink = on_fatal_signal(os.path.join(run_dir, runfile.fatal_file_name(rank)))
        self.error_written = False   # error-{R}.json holds the first exception; it stays
        specs = [spec for spec in faults.parse_faults(os.environ.get(faults.ENV_VAR, ""))
                 if spec.rank == rank]
        self.faults = faults.FaultPlan(specs, record=lambda spec: self.file.fault(
            str(spec), time.time()))
        if specs:
            self.file.fault(str(specs[0]), 0.0)
        self.depth = 0
        self.traced_thread = threading.get_ident()
        self.seqs: dict[tuple, int] = {}
        self.sites: dict[tuple[int, int], bytes] = {}
        self.codes: dict[int, tuple[object, bool]] = {}
        self.tensor_info: dict[tuple, tuple[bytes, bytes, int]] = {}
        self.capture: Capture | None = None         # the CUDA graph being captured
        self.device = identity["device"]
        self.on_device = self.device.startswith("cuda")
        if self.on_device:
            self.capturing, self.new_event, self.set_device = cuda_calls()
        self.in_flight: deque[InFlight] = deque()   # main thread appends, heartbeat pops
        self.step_work: deque[StepWork] = deque()   # likewise
        self.device_done_at = 0.0                   # when the heartbeat saw step work finish
        self.free_events: deque = deque()            # heartbeat returns, main thread takes
        self.device_lock = threading.Lock()          # the heartbeat's event queries, or a capture
        self.device_set = False
        threading.Thread(target=self._beat, name="diag-heartbeat", daemon=True).start()

    # Phases.

    def enter_phase(self, name: str, step: int | None) -> int:
        fault = self.faults.before_phase(name, step) if self.faults.armed else None
        if self.depth == 0:
            self.traced_thread = threading.get_ident()
        self.depth += 1
        event = self.file.open_phase(name, step, time.time(), self.depth)
        if fault is not None:
            try:
                self.faults.inside_phase(fault)
            except Exception as error:     # kind=raise: the phase ends in it
                self.exit_phase(event, name, step)
                self.phase_error(error, error.__traceback__, name, step)
                raise
        return event

    def exit_phase(self, event: int, name: str, step: int | None) -> None:
        self.depth -= 1
        now = time.time()
        self.file.close_phase(event, now, self.depth)
        if self.on_device and name in DEVICE_PHASES and len(self.step_work) < MAX_STEP_WORK:
            self._watch_step_work(DeviceWork(name, step, now))

    def _watch_step_work(self, work: DeviceWork) -> None:
        try:
            if not self.capturing():     # an event in a graph being captured says nothing
                self.step_work.append(StepWork(work, self.record_event()))
        except RuntimeError:             # the CUDA context is broken (a device-side error)
            self.on_device = False

    def phase_error(self, error: BaseException, tb, name: str, step: int | None) -> None:
        """Writes error-{R}.json for the first exception that leaves a phase (the
        innermost phase it leaves): the root cause, which a later error (the
        shutdown's, once peers give up) must not hide. It is written here, before
        the code that catches it cleans up: a CUDA error's clean-up may never end."""
        if self.error_written:
            return
        self.error_written = True
        caller = tb.tb_frame.f_back
        frames = (traceback.extract_stack(caller) if caller else []) + traceback.extract_tb(tb)
        body = {"pid": os.getpid(), "at": time.time(), "phase": name, "step": step,
                "error": traceback.format_exception_only(type(error), error)[-1].strip(),
                "frame": own_frame(frames),
                "frames": [[frame.filename, frame.lineno, frame.name, frame.line or ""]
                           for frame in frames]}
        path = os.path.join(self.run_dir, runfile.error_file_name(self.rank))
        try:
            with open(path, "w") as sink:
                json.dump(stamped(Document.ERROR, body), sink)
        except OSError:
            pass

    # Collectives.

    def begin_collective(self, group, op, tensors, peer, caller) -> Traced | Off:
        if self.faults.skip_next_collective:
            self.faults.skip_next_collective = False
            return SKIPPED
        key = (group, op, peer) if peer is not None else group
        shapes, dtype, nbytes = self._describe(tensors)
        site = self._call_site(caller)
        if self.capture is not None:
            self.capture.calls.append(CapturedCall(key, group, op, peer, shapes, dtype,
                                                    nbytes, site))
            return OFF
        seq = self.seqs.get(key, 0)
        self.seqs[key] = seq + 1
        on_device = self.on_device and bool(tensors) and tensors[0].is_cuda and not self.capturing()
        at = self.file.open_collective(group, seq, op, peer, shapes, dtype, nbytes, site,
                                       time.time(), on_device)
        if not on_device:
            return Traced(self.file, at)
        return TracedOnDevice(self, at, self.record_event())

    def publish_replay(self, calls: list[CapturedCall], t_enqueue: float, start) -> None:
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
            self.in_flight.append(InFlight(records, start, end))

    def record_event(self):
        event = self.free_events.pop() if self.free_events else self.new_event()
        event.record()
        return event

    def watch_device(self, records: list[tuple[int, int]], start) -> None:
        self.in_flight.append(InFlight(records, start, self.record_event()))

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
            site = self.sites[key] = frame_label(
                code.co_filename, frame.f_lineno, code.co_name).encode()
        return site

    # Heartbeat thread.

    def _beat(self) -> None:
        me = threading.get_ident()
        count, answered = 0, 0
        while True:
            count += 1
            self.file.heartbeat(time.time(), count, self._traced_frame())
            if (self.in_flight or self.step_work) and self.device_lock.acquire(blocking=False):
                try:
                    self._poll_device()
                finally:
                    self.device_lock.release()
            request = self.file.dump_request()
            if request != answered:
                self._dump(request, me)
                answered = request
            time.sleep(runfile.HEARTBEAT_S)

    def _poll_device(self) -> None:
        now = time.time()
        try:
            if not self.device_set:   # events are queried from this thread: same device
                self.set_device(self.device)
                self.device_set = True
            self._forget_overwritten()
            self._poll_calls(now)
            self._poll_step_work(now)
        except RuntimeError:        # the CUDA context is broken (a device-side error)
            self.on_device = False
            self.in_flight.clear()
            self.step_work.clear()

    def _poll_calls(self, now: float) -> None:
        """Marks the calls the GPU has reached and finished since the last beat.
        A stream runs its work in order, so the first unfinished call ends the scan."""
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

    def _poll_step_work(self, now: float) -> None:
        """Drops the step work the GPU finished and publishes the oldest it has
        not. In stream order: once the newest is done, all are."""
        work = self.step_work
        if not work:
            return
        all_done = work[-1].event.query()
        while work and (all_done or work[0].event.query()):
            self.free_events.append(work.popleft().event)
            self.device_done_at = now
        self.file.device_work(self.device_done_at, work[0].work if work else None)

    def _forget_overwritten(self) -> None:
        """Calls whose records the ring no longer holds need no query: a busy rank
        makes thousands between two beats."""
        oldest_kept = self.file.coll_head - runfile.COLLECTIVE_CAPACITY
        while self.in_flight and self.in_flight[0].records[-1][1] <= oldest_kept:
            call = self.in_flight.popleft()
            self.free_events.extend((call.start, call.end))

    def _mark(self, call: InFlight, done: bool, now: float) -> None:
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
        fr_dump.write_gloo_dump()
        self.file.dump_done(request)

    def _traced_frame(self) -> str:
        frame = sys._current_frames().get(self.traced_thread)
        if frame is None:
            return ""
        return frame_label(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)


def own_frame(frames: list[traceback.FrameSummary]) -> str | None:
    """The innermost frame of the program's own code: not diag's probe, Python's
    standard library or torch; the innermost frame if all are."""
    own = [frame for frame in frames if not frame.filename.startswith((DIAGNOSE_DIR, STDLIB_DIR))
           and TORCH_DIR not in frame.filename]
    frame = (own or frames or [None])[-1]
    return None if frame is None else frame_label(frame.filename, frame.lineno, frame.name)


def on_fatal_signal(path: str):
    """faulthandler writes every thread's stack to `path` on SIGABRT, SIGSEGV, SIGBUS,
    SIGFPE or SIGILL. The first line names the thread that called init (the
    engine's), whose stack shows where the host was. Returns the open file, which
    must stay open; None where the process had turned faulthandler on itself."""
    if faulthandler.is_enabled():
        return None
    sink = open(path, "w")
    sink.write(f"{runfile.FATAL_MAIN_THREAD} 0x{threading.get_ident():x}\n")
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


def cuda_calls():
    """(is the stream capturing a graph, make an event, set the thread's device):
    torch is imported only by a probe that traces a CUDA device."""
    import torch
    return (torch.cuda.is_current_stream_capturing, torch.cuda.Event,
            lambda device: torch.cuda.set_device(torch.device(device)))
