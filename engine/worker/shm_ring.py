"""Shared-memory broadcast ring: one writer (the driver), N readers (the workers).

Layout of the segment:

    header   closed:u64  written:u64  read[0..N-1]:u64
    slots    n_slots x (nbytes:u32  more:u32  payload[slot_bytes])

Message m lives in slot m % n_slots. The writer may reuse a slot once every
reader's `read` counter has passed it; reader r may read message read[r] once
`written` is beyond it. A payload larger than a slot is split over consecutive
messages, each but the last flagged `more`. Counters are 8-byte aligned words,
written after the payload, so a reader never sees a half-written message.
"""
from __future__ import annotations

import pickle
import struct
import time
from multiprocessing import shared_memory
from typing import Callable

_WORD = struct.Struct("<Q")
_SLOT_HEADER = struct.Struct("<II")


class RingClosed(Exception):
    """The writer closed the ring: readers stop."""


class _Backoff:
    """Sleep a little longer each time a wait finds nothing, up to 2 ms; up to
    `fast_delay_s` instead for the first FAST_FOR_S of the wait, if given."""

    FAST_FOR_S = 0.05

    def __init__(self, fast_delay_s: float | None = None):
        self.delay = 0.0
        self.fast_delay_s = fast_delay_s
        self.fast_until = time.monotonic() + self.FAST_FOR_S if fast_delay_s else 0.0

    def wait(self):
        time.sleep(self.delay)
        cap = 2e-3
        if self.fast_delay_s and time.monotonic() < self.fast_until:
            cap = self.fast_delay_s
        self.delay = min(max(self.delay * 2, 2e-5), cap)


class ShmRing:
    def __init__(self, shm: shared_memory.SharedMemory, n_readers: int, n_slots: int,
                 slot_bytes: int, owner: bool):
        self.shm = shm
        self.n_readers = n_readers
        self.n_slots = n_slots
        self.slot_bytes = slot_bytes
        self.owner = owner
        self._buf = shm.buf
        self._slots_at = 8 * (2 + n_readers)

    @classmethod
    def create(cls, n_readers: int, n_slots: int = 8, slot_bytes: int = 1 << 20) -> "ShmRing":
        size = 8 * (2 + n_readers) + n_slots * (_SLOT_HEADER.size + slot_bytes)
        shm = shared_memory.SharedMemory(create=True, size=size)
        shm.buf[: 8 * (2 + n_readers)] = bytes(8 * (2 + n_readers))
        return cls(shm, n_readers, n_slots, slot_bytes, owner=True)

    @property
    def handle(self) -> tuple:
        return (self.shm.name, self.n_readers, self.n_slots, self.slot_bytes)

    @classmethod
    def attach(cls, handle: tuple) -> "ShmRing":
        name, n_readers, n_slots, slot_bytes = handle
        # Readers are spawned by the writer and share its resource tracker, so
        # attaching registers nothing new and only the writer unlinks the segment.
        shm = shared_memory.SharedMemory(name=name)
        return cls(shm, n_readers, n_slots, slot_bytes, owner=False)

    # -- counters ---------------------------------------------------------
    def _get(self, index: int) -> int:
        return _WORD.unpack_from(self._buf, 8 * index)[0]

    def _set(self, index: int, value: int) -> None:
        _WORD.pack_into(self._buf, 8 * index, value)

    @property
    def closed(self) -> bool:
        return self._get(0) == 1

    @property
    def written(self) -> int:
        return self._get(1)

    def read_count(self, reader: int) -> int:
        return self._get(2 + reader)

    def _slot_offset(self, message: int) -> int:
        return self._slots_at + (message % self.n_slots) * (_SLOT_HEADER.size + self.slot_bytes)

    # -- writer -----------------------------------------------------------
    def enqueue(self, obj, should_abort: Callable[[], None] = lambda: None) -> int:
        """Write obj for every reader; returns the messages written so far.
        should_abort is called while waiting for a slot and may raise."""
        payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        chunks = [payload[i:i + self.slot_bytes]
                  for i in range(0, max(len(payload), 1), self.slot_bytes)]
        for i, chunk in enumerate(chunks):
            self._write_chunk(chunk, more=i + 1 < len(chunks), should_abort=should_abort)
        return self.written

    def _write_chunk(self, chunk: bytes, more: bool, should_abort) -> None:
        message = self.written
        backoff = _Backoff()
        while min(self.read_count(r) for r in range(self.n_readers)) <= message - self.n_slots:
            should_abort()
            backoff.wait()
        offset = self._slot_offset(message)
        _SLOT_HEADER.pack_into(self._buf, offset, len(chunk), int(more))
        start = offset + _SLOT_HEADER.size
        self._buf[start:start + len(chunk)] = chunk
        self._set(1, message + 1)

    def readers_behind(self) -> list[int]:
        """Readers that have not taken every message written."""
        written = self.written
        return [r for r in range(self.n_readers) if self.read_count(r) < written]

    def close(self) -> None:
        self._set(0, 1)

    # -- reader -----------------------------------------------------------
    def dequeue(self, reader: int, should_abort: Callable[[], None] = lambda: None,
                fast_delay_s: float | None = None):
        """The next message; should_abort is called while waiting and may raise.
        fast_delay_s: poll at least this often for the wait's first 50 ms."""
        parts = []
        more = True
        while more:
            chunk, more = self._read_chunk(reader, should_abort, fast_delay_s)
            parts.append(chunk)
        return pickle.loads(b"".join(parts))

    def _read_chunk(self, reader: int, should_abort, fast_delay_s) -> tuple[bytes, bool]:
        message = self.read_count(reader)
        backoff = _Backoff(fast_delay_s)
        while self.written <= message:
            if self.closed:
                raise RingClosed()
            should_abort()
            backoff.wait()
        offset = self._slot_offset(message)
        nbytes, more = _SLOT_HEADER.unpack_from(self._buf, offset)
        start = offset + _SLOT_HEADER.size
        chunk = bytes(self._buf[start:start + nbytes])
        self._set(2 + reader, message + 1)
        return chunk, bool(more)

    # -- lifetime ---------------------------------------------------------
    def release(self) -> None:
        """Drop this process's mapping; the owner also removes the segment."""
        self._buf = None
        self.shm.close()
        if self.owner:
            self.shm.unlink()
