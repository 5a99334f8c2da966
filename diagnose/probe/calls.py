"""What the probe's phase, collective and CUDA-graph calls return: context
managers that write the records, or do nothing while the probe is off."""
from __future__ import annotations

import time


class Off:
    """What phase(), collective() and the graph calls return while the probe is off."""
    skip = False
    calls = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


OFF = Off()


class PhaseCall:
    __slots__ = ("probe", "name", "step", "event")

    def __init__(self, probe, name, step):
        self.probe = probe
        self.name = name
        self.step = step

    def __enter__(self):
        self.event = self.probe.enter_phase(self.name, self.step)
        return self

    def __exit__(self, exc_type, exc, tb):
        self.probe.exit_phase(self.event, self.name, self.step)
        if exc_type is not None and issubclass(exc_type, Exception):
            self.probe.phase_error(exc, tb, self.name, self.step)
        return False


class Traced:
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


class TracedOnDevice(Traced):
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


class CapturedCall:
    """A collective called while a CUDA graph was captured, as each replay records it."""
    __slots__ = ("key", "group", "op", "peer", "shapes", "dtype", "nbytes", "site")

    def __init__(self, key, group, op, peer, shapes, dtype, nbytes, site):
        self.key, self.group, self.op, self.peer = key, group, op, peer
        self.shapes, self.dtype, self.nbytes, self.site = shapes, dtype, nbytes, site


class Capture:
    """While a graph is captured the heartbeat thread queries no event: a CUDA call
    from another thread can invalidate a capture (in CUDA's global capture mode)."""
    __slots__ = ("probe", "calls")

    def __init__(self, probe):
        self.probe = probe
        self.calls: list[CapturedCall] = []

    def __enter__(self):
        self.probe.device_lock.acquire()
        self.probe.capture = self
        return self

    def __exit__(self, *exc):
        self.probe.capture = None
        self.probe.device_lock.release()
        return False


class Replay:
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


class InFlight:
    """Traced calls the GPU has not finished: (record offset, n) of each, and the
    events recorded before and after them."""
    __slots__ = ("records", "start", "end", "started")

    def __init__(self, records, start, end):
        self.records, self.start, self.end = records, start, end
        self.started = False


class StepWork:
    """The work a step phase enqueued on the GPU: an event recorded as the host
    left the phase, done once the GPU has run everything before it."""
    __slots__ = ("work", "event")

    def __init__(self, work, event):
        self.work, self.event = work, event


class Skipped(Off):
    skip = True


SKIPPED = Skipped()
