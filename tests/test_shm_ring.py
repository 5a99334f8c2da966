"""The shared-memory broadcast ring with real reader processes."""
import multiprocessing as mp
import os

import pytest

from engine.worker.shm_ring import RingClosed, ShmRing


def _reader(handle, reader, conn):
    ring = ShmRing.attach(handle)
    got = []
    try:
        while True:
            got.append(ring.dequeue(reader))
    except RingClosed:
        conn.send(got)
    finally:
        ring.release()


def _shm_exists(name: str) -> bool:
    return os.path.exists(f"/dev/shm/{name.lstrip('/')}")


@pytest.mark.parametrize("payload_bytes", [10, 3000])
def test_every_reader_gets_every_message_in_order(payload_bytes):
    ring = ShmRing.create(n_readers=3, n_slots=4, slot_bytes=1024)
    ctx = mp.get_context("spawn")
    pipes = [ctx.Pipe(duplex=False) for _ in range(3)]
    procs = [ctx.Process(target=_reader, args=(ring.handle, r, pipes[r][1])) for r in range(3)]
    for p in procs:
        p.start()
    messages = [(i, "x" * payload_bytes) for i in range(20)]  # more messages than slots
    for m in messages:
        ring.enqueue(m)
    ring.close()
    results = [pipes[r][0].recv() for r in range(3)]
    for p in procs:
        p.join(timeout=10)
    name = ring.shm.name
    ring.release()
    assert all(r == messages for r in results)
    assert not _shm_exists(name)


def test_writer_waits_for_slowest_reader_and_can_abort():
    ring = ShmRing.create(n_readers=2, n_slots=2, slot_bytes=64)
    ring.enqueue("a")
    ring.enqueue("b")
    assert ring.dequeue(0) == "a"
    assert ring.readers_behind() == [0, 1]

    class Stop(Exception):
        pass

    def abort():
        raise Stop()

    with pytest.raises(Stop):  # reader 1 has not freed slot 0
        ring.enqueue("c", should_abort=abort)
    assert ring.dequeue(1) == "a"
    ring.enqueue("c", should_abort=abort)
    ring.release()
