"""The collector over probe files written by RunFileWriter: bad files, torn
records, liveness, dump requests, and the speed of a 1024-rank read."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import psutil
import pytest

from diagnose.core import runfile
from helpers.collecting import collect
from diagnose.launch import collector

CREATE_TIME = psutil.Process().create_time()


def write_rank(run_dir, rank: int, pid: int = os.getpid(), create_time: float = CREATE_TIME,
               events: int = 3) -> runfile.RunFileWriter:
    identity = {"role": "worker", "rank": rank, "world_size": 2, "tp_rank": rank % 2,
                "tp_size": 2, "pp_rank": rank // 2, "pp_size": 1, "host": os.uname().nodename,
                "pid": pid, "device": "cpu", "env": {}, "groups": {"tp0": [0, 1]}}
    writer = runfile.RunFileWriter(str(run_dir / runfile.probe_file_name(rank)), identity,
                                   pid, create_time, time.time())
    for step in range(events):
        outer = writer.open_phase("execute_model", step, time.time(), 1)
        writer.open_phase("forward", step, time.time(), 2)
        at = writer.open_collective("tp0", step, "all_reduce", None, b"4x8", b"float32", 128,
                                    b"engine/layers.py:88 forward", time.time())
        writer.complete_collective(at, time.time())
        writer.close_phase(outer + 1, time.time(), 1)
        writer.close_phase(outer, time.time(), 0)
    writer.heartbeat(time.time(), 1, "engine/worker.py:1 run")
    return writer


def test_bad_files_are_skipped_with_a_note(tmp_path):
    write_rank(tmp_path, 0)
    good = (tmp_path / "rank-0.probe").read_bytes()
    (tmp_path / "rank-1.probe").write_bytes(good[:100])
    (tmp_path / "rank-2.probe").write_bytes(b"\x07" * len(good))
    (tmp_path / "rank-3.probe").write_bytes(b"")
    newer = bytearray(good)
    newer[8:12] = (99).to_bytes(4, "little")
    (tmp_path / "rank-4.probe").write_bytes(bytes(newer))
    (tmp_path / "rank-5.probe").write_bytes(good[:runfile.IDENTITY_AT] + b"{not json" +
                                            b" " * (len(good) - runfile.IDENTITY_AT - 9))
    (tmp_path / "rank-6.probe").write_bytes(good[:-10])

    reader = collector.Collector(str(tmp_path))
    snapshot = reader.snapshot()

    assert list(snapshot.ranks) == [0]
    notes = dict(note.split(": ", 1) for note in reader.notes)
    assert "truncated" in notes["rank-1.probe"]
    assert "not a probe file" in notes["rank-2.probe"]
    assert "truncated" in notes["rank-3.probe"]
    assert "layout version 99" in notes["rank-4.probe"]
    assert "identity is not JSON" in notes["rank-5.probe"]
    assert "truncated" in notes["rank-6.probe"]


def test_torn_or_overwritten_records_are_dropped(tmp_path):
    write_rank(tmp_path, 0, events=3)
    path = tmp_path / "rank-0.probe"
    raw = bytearray(path.read_bytes())
    second = runfile.COLL_RING_AT + runfile.COLL_RECORD.size
    raw[second + runfile.COLL_RECORD.size - 8] ^= 0xFF  # the closing event number of record 2
    path.write_bytes(bytes(raw))

    state = collect(str(tmp_path)).ranks[0]
    assert [c.seq for c in state.collectives] == [0, 2]
    assert len(state.phases) == 6


def test_the_rings_keep_the_latest_records(tmp_path):
    write_rank(tmp_path, 0, events=100)
    state = collect(str(tmp_path), history=10).ranks[0]
    assert [c.seq for c in state.collectives] == list(range(90, 100))
    assert [(p.name, p.step) for p in state.phases[-2:]] == [("execute_model", 99),
                                                             ("forward", 99)]
    assert all(p.end is not None for p in state.phases)
    assert state.frame == "engine/worker.py:1 run"


def test_alive_needs_the_same_process_not_just_the_pid(tmp_path):
    write_rank(tmp_path, 0)
    write_rank(tmp_path, 1, create_time=CREATE_TIME - 3600)     # pid reused by us later
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    while psutil.Process(zombie.pid).status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.01)
    write_rank(tmp_path, 2, pid=zombie.pid,
               create_time=psutil.Process(zombie.pid).create_time())
    try:
        ranks = collect(str(tmp_path)).ranks
    finally:
        zombie.wait()
    assert [ranks[r].alive for r in (0, 1, 2)] == [True, False, False]


def test_dump_request_of_a_dead_rank_says_so_at_once(tmp_path):
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    write_rank(tmp_path, 0, pid=int(done.stdout))
    started = time.monotonic()
    assert collector.request_dump(str(tmp_path), wait_s=5) == [
        f"rank-0.probe: process {done.stdout.strip()} is not running"]
    assert time.monotonic() - started < 1


def test_a_dump_unanswered_is_reported(tmp_path):
    write_rank(tmp_path, 0)  # this process has no heartbeat thread to answer
    assert collector.request_dump(str(tmp_path), wait_s=0.2) == [
        "rank-0.probe: no dump within 0.2s"]


@pytest.fixture
def big_run(tmp_path):
    """1024 ranks, each with more events than a snapshot keeps."""
    yield tmp_path, [write_rank(tmp_path, rank, events=collector.HISTORY + 8)
                     for rank in range(1024)]
    shutil.rmtree(tmp_path)


def test_1024_live_ranks_are_all_read(big_run):
    """The time this takes is a benchmark's business (benchmarks/), not a test's."""
    run_dir, writers = big_run
    reader = collector.Collector(str(run_dir))
    reader.snapshot()
    for writer in writers:
        writer.heartbeat(time.time(), 2, "engine/worker.py:2 run")
    snapshot = reader.snapshot()
    assert len(snapshot.ranks) == 1024 and not reader.notes
    assert all(state.alive for state in snapshot.ranks.values())
    assert len(snapshot.ranks[1023].collectives) == collector.HISTORY
