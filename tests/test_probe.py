"""The probe in real processes, read from outside by the collector."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from diagnose.core import runfile
from helpers.collecting import collect, rank_in_phase
from helpers.run import wait_for
from diagnose.launch import collector
from diagnose.launch.py_spy import py_spy_dump

REPO = Path(__file__).resolve().parents[1]


STARTUP_S = 180.0   # a deadline, not a wait: wait_for returns once the condition holds


TP_CHILD = """
    import sys, time, torch
    from diagnose import probe
    from engine.communicator import Communicator, Layout

    rank, store = int(sys.argv[1]), sys.argv[2]
    layout = Layout(tp_size=2, pp_size=1)
    probe.init("worker", rank=rank, world_size=2, tp_rank=rank, tp_size=2, pp_rank=0,
               pp_size=1, groups=layout.groups_of(rank))
    with probe.phase("init_distributed"):
        comm = Communicator(layout, rank, init_method=f"file://{store}")

    def forward():
        x = torch.ones(4, 8)
        comm.all_reduce(x)
        comm.all_reduce(x)
        comm.all_gather(torch.ones(2, 3))
        if rank == 0:
            comm.send([torch.ones(5), torch.ones(5)], dst=1)
        else:
            comm.recv([((5,), torch.float32)] * 2, src=0)

    for step in range(2):
        with probe.phase("execute_model", step=step):
            with probe.phase("forward", step=step):
                forward()
    with probe.phase("execute_model", step=2):
        time.sleep(120)
"""


def test_phases_and_collectives_of_two_gloo_ranks_are_visible_while_they_run(
        spawn, run_dir, tmp_path):
    store = tmp_path / "store"
    for rank in (0, 1):
        spawn(TP_CHILD, str(rank), str(store))
    # Two torch imports and a gloo rendezvous take most of a minute on a loaded machine.
    states = [wait_for(lambda r=rank: rank_in_phase(run_dir, r, "execute_model", 2),
                       timeout=STARTUP_S, what=f"rank {rank} in execute_model step 2")
              for rank in (0, 1)]

    for rank, state in enumerate(states):
        assert state.alive
        assert state.identity.tp_rank == rank and state.identity.groups["tp0"] == [0, 1]
        assert [(p.name, p.step) for p in state.open_phases] == [("execute_model", 2)]
        assert [(p.name, p.step, p.end is not None) for p in state.phases] == [
            ("init_distributed", None, True), ("execute_model", 0, True), ("forward", 0, True),
            ("execute_model", 1, True), ("forward", 1, True), ("execute_model", 2, False)]
        tp = [c for c in state.collectives if c.group == "tp0"]
        assert [(c.op, c.seq) for c in tp] == [("all_reduce", 0), ("all_reduce", 1),
                                               ("all_gather", 2), ("all_reduce", 3),
                                               ("all_reduce", 4), ("all_gather", 5)]
        assert (tp[0].shapes, tp[0].dtype, tp[0].nbytes) == ([[4, 8]], "float32", 128)
        assert tp[2].shapes == [[2, 3]]
        assert all(c.state == "completed" and c.t_complete >= c.t_enqueue
                   for c in state.collectives)
        assert all(f"/child{rank}.py:" in c.site and c.site.endswith(" forward")
                   for c in state.collectives), state.collectives[0].site
        op, peer = ("send", 1) if rank == 0 else ("recv", 0)
        assert [(c.op, c.peer, c.seq) for c in state.collectives if c.group == "pp"] == [
            (op, peer, seq) for seq in range(4)]


BLOCKED_CHILD = """
    import sys, threading, time
    from diagnose import probe

    probe.init("worker", rank=0, world_size=1)

    def wait_in_sleep():
        time.sleep(120)

    def wait_on_lock():
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()

    with probe.phase("forward", step=7):
        {"sleep": wait_in_sleep, "lock": wait_on_lock}[sys.argv[1]]()
"""


def heartbeats(run_dir) -> int:
    with open(run_dir / "rank-0.probe", "rb") as source:
        fd = source.fileno()
        return runfile.read_probe(fd, 0).heartbeat_count


@pytest.mark.parametrize("blocked_in", ["sleep", "lock"])
def test_heartbeat_goes_on_while_the_main_thread_is_blocked(spawn, run_dir, blocked_in):
    spawn(BLOCKED_CHILD, blocked_in)
    wait_for(lambda: rank_in_phase(run_dir, 0, "forward", 7), what="forward step 7")
    before = heartbeats(run_dir)
    wait_for(lambda: heartbeats(run_dir) >= before + 3, what="3 heartbeats more")
    state = collect(str(run_dir)).ranks[0]
    assert time.time() - state.heartbeat_at < 0.5
    function = "wait_in_sleep" if blocked_in == "sleep" else "wait_on_lock"
    assert state.frame.endswith(f" {function}"), state.frame


def test_stacks_are_dumped_on_request(spawn, run_dir):
    child = spawn(BLOCKED_CHILD, "sleep")
    wait_for(lambda: rank_in_phase(run_dir, 0, "forward", 7), what="forward step 7")

    assert collector.request_dump(str(run_dir)) == []

    threads = collect(str(run_dir)).ranks[0].stacks
    assert list(threads) == ["MainThread"]  # the heartbeat thread leaves itself out
    assert threads["MainThread"][-1].endswith(" wait_in_sleep")
    assert threads["MainThread"][0].endswith(" <module>")
    external = py_spy_dump(child.pid)
    assert external.note is None
    assert any(frames[-1].endswith(" wait_in_sleep") for frames in external.threads.values())


def test_py_spy_of_a_missing_process_gives_a_note(spawn):
    child = spawn("pass")
    child.wait()
    external = py_spy_dump(child.pid, timeout=10)
    assert external.threads is None
    assert str(child.pid) in external.note


KILLED_CHILD = """
    import time, torch
    from diagnose import probe

    probe.init("worker", rank=0, world_size=1)
    with probe.phase("execute_model", step=4):
        with probe.phase("forward", step=4):
            with probe.collective("tp0", "all_reduce", [torch.ones(3, dtype=torch.float16)]):
                time.sleep(120)
"""


def test_state_survives_sigkill(spawn, run_dir):
    child = spawn(KILLED_CHILD)
    wait_for(lambda: rank_in_phase(run_dir, 0, "forward", 4), what="forward step 4")
    child.send_signal(signal.SIGKILL)
    child.wait()

    state = collect(str(run_dir)).ranks[0]
    assert not state.alive
    assert [(p.name, p.step) for p in state.open_phases] == [("execute_model", 4), ("forward", 4)]
    (record,) = state.collectives
    assert (record.op, record.seq, record.state, record.t_complete) == (
        "all_reduce", 0, "enqueued", None)
    assert (record.shapes, record.dtype, record.nbytes) == ([[3]], "float16", 6)


def test_probe_is_off_without_run_dir(tmp_path):
    script = textwrap.dedent("""
        from diagnose import probe
        probe.init("worker", rank=0, world_size=1)
        with probe.phase("forward", step=1):
            with probe.collective("tp0", "all_reduce", []) as record:
                assert record.skip is False
        probe.kv_stats(1, 2, 3, 4, 5, 6)
        assert not probe.is_on()
    """)
    env = {key: value for key, value in os.environ.items() if key != "DIAG_RUN_DIR"}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert list(tmp_path.iterdir()) == []


DRIVER_CHILD = """
    import os, time
    from diagnose import probe

    probe.init("driver")
    probe.ring_state(5)
    probe.kv_stats(3, used=10, free=90, allocated=12, freed=2, preempted=1)
    probe.worker_exit(2, -9)
    if os.fork() == 0:
        with probe.phase("schedule", step=99):  # a forked child does not write its parent's file
            os._exit(0)
    os.wait()
    with probe.phase("schedule", step=3):
        time.sleep(120)
"""


def test_driver_state_and_forked_children_stay_out(spawn, run_dir):
    spawn(DRIVER_CHILD)

    def driver_scheduling():
        driver = collect(str(run_dir)).driver
        return driver if driver and driver.phase and driver.phase.name == "schedule" else None

    driver = wait_for(driver_scheduling, what="the driver in schedule")
    assert driver.identity.role == "driver" and driver.identity.rank is None
    assert driver.ring_written == 5
    assert (driver.kv.step, driver.kv.used, driver.kv.free, driver.kv.preempted) == (3, 10, 90, 1)
    assert [(e.rank, e.exitcode) for e in driver.worker_exits] == [(2, -9)]
    assert [(p.name, p.step) for p in driver.phases] == [("schedule", 3)]
    assert sorted(os.listdir(run_dir)) == ["driver.probe", "fatal-driver.txt"]


GRAPH_CHILD = """
    import time, torch
    from diagnose import probe

    probe.init("worker", rank=0, world_size=2, tp_rank=0, tp_size=2, pp_rank=0, pp_size=1)
    x = torch.ones(2, 8)

    def layer():
        with probe.collective("tp0", "all_reduce", [x]) as record:
            assert not record.skip

    def model():
        layer()
        layer()

    with probe.phase("warmup"):
        model()                                   # eager: seqs 0 and 1
        with probe.graph_capture() as graph:
            model()                               # captured: no record, no seq
    for step in range(3):
        with probe.phase("execute_model", step=step):
            with probe.graph_replay(graph):
                time.sleep(0.01)                  # the replay
            with probe.collective("tp0", "all_gather", [torch.ones(2, 4)]):
                pass
    with probe.phase("execute_model", step=3):
        time.sleep(120)
"""


def test_each_graph_replay_records_the_captured_collectives_with_the_next_seqs(spawn, run_dir):
    spawn(GRAPH_CHILD)
    state = wait_for(lambda: rank_in_phase(run_dir, 0, "execute_model", 3), what="step 3")
    records = [(c.op, c.seq) for c in state.collectives]
    assert records == [("all_reduce", 0), ("all_reduce", 1)] + [
        (op, seq) for step in range(3)
        for op, seq in [("all_reduce", 2 + 3 * step), ("all_reduce", 3 + 3 * step),
                        ("all_gather", 4 + 3 * step)]]
    replayed = [c for c in state.collectives[2:] if c.op == "all_reduce"]
    assert {c.site for c in replayed} == {state.collectives[0].site}  # as at capture
    assert state.collectives[0].site.endswith(" layer")
    assert all(c.state == "completed" and not c.device for c in state.collectives)
    first, second = replayed[:2]                  # one replay: enqueued together
    assert first.t_enqueue == second.t_enqueue and first.t_complete == second.t_complete
    assert first.t_complete - first.t_enqueue >= 0.01
    assert (first.shapes, first.dtype, first.nbytes) == ([[2, 8]], "float32", 64)


ENDING_CHILD = """
    import os, threading, time
    from diagnose import probe

    probe.init("worker", rank=3, world_size=4)

    def launch():
        raise RuntimeError("CUDA error: device-side assert triggered")

    def clean_up():
        threading.Timer(0.2, os.abort).start()   # as NCCL's watchdog does
        time.sleep(60)

    with probe.phase("execute_model", step=5):
        try:
            with probe.phase("forward", step=5):
                launch()
        except RuntimeError:
            clean_up()
"""


def test_an_exception_leaving_a_phase_and_a_fatal_signal_leave_their_files(spawn, run_dir):
    child = spawn(ENDING_CHILD)
    child.wait(timeout=60)
    assert child.returncode == -signal.SIGABRT
    error = json.loads((run_dir / "error-3.json").read_text())
    assert (error["phase"], error["step"], error["pid"]) == ("forward", 5, child.pid)
    assert error["error"] == "RuntimeError: CUDA error: device-side assert triggered"
    assert [frame[2:] for frame in error["frames"]][-2:] == [
        ["<module>", "launch()"], ["launch", 'raise RuntimeError("CUDA error: device-side assert triggered")']]
    fatal = (run_dir / "fatal-3.txt").read_text().splitlines()
    main = int(fatal[0].removeprefix("diag: main thread "), 16)
    assert "Fatal Python error: Aborted" in fatal
    at = fatal.index(next(line for line in fatal if line.startswith("Thread 0x")
                          and int(line.split()[1], 16) == main))
    assert fatal[at + 1].endswith(" in clean_up")


class _Marked:
    """A method, a staticmethod and a classmethod for --mark to wrap."""

    def __init__(self, base: int):
        self.base = base

    def forward(self, x: int) -> int:
        return self.base + x

    @staticmethod
    def double(x: int) -> int:
        return 2 * x

    @classmethod
    def name(cls, suffix: str) -> str:
        return cls.__name__ + suffix


def test_a_marked_method_staticmethod_and_classmethod_keep_their_kind(monkeypatch):
    """vLLM's compile wrapper reads `self` from the traced frame of the forward it
    compiles: a marked method must take `self` by that name, not in *args."""
    from types import SimpleNamespace

    from diagnose.probe import marks
    for name in ("forward", "double", "name"):
        monkeypatch.setattr(_Marked, name, _Marked.__dict__[name])
    module = SimpleNamespace(_Marked=_Marked)
    for qualname in ("_Marked.forward", "_Marked.double", "_Marked.name"):
        marks.apply(marks.parse_mark(f"m:{qualname}"), module)
    assert _Marked.forward.__code__.co_varnames[0] == "self"
    assert _Marked.forward.__wrapped__.__name__ == "forward"
    assert isinstance(_Marked.__dict__["double"], staticmethod)
    assert isinstance(_Marked.__dict__["name"], classmethod)
    marked = _Marked(40)
    assert (marked.forward(2), marked.double(3), _Marked.double(4)) == (42, 6, 8)
    assert (marked.name("!"), _Marked.name("?")) == ("_Marked!", "_Marked?")


def _close_files_then_exit(delay_s: float) -> None:
    """As a dying process does in the kernel, stretched: its files close (the parent's
    sentinel fires) a while before it is gone and its exit code can be read."""
    os.closerange(3, 1024)
    time.sleep(delay_s)
    os._exit(7)


def test_a_worker_whose_sentinel_fired_before_its_exit_code_is_noted(monkeypatch):
    """vLLM's monitor starts the shutdown as soon as a worker's sentinel fires; the
    worker's exit code may not be readable yet. The plugin waits for it rather than
    taking the worker for one that the shutdown will end (CI saw that race: a
    SIGKILLed worker was reported as ended). probe.worker_exit is replaced by a list,
    the one double here: the probe file's own writing is tested above."""
    import multiprocessing
    import multiprocessing.connection
    from types import SimpleNamespace

    from diagnose.probe import vllm as vllm_plugin
    noted = []
    monkeypatch.setattr(vllm_plugin.probe, "worker_exit", lambda rank, code: noted.append((rank, code)))
    monkeypatch.setattr(vllm_plugin, "_noted_exits", set())
    ctx = multiprocessing.get_context("fork")
    dying = ctx.Process(target=_close_files_then_exit, args=(0.5,))
    alive = ctx.Process(target=time.sleep, args=(30,))
    for proc in (dying, alive):
        proc.start()
    try:
        multiprocessing.connection.wait([dying.sentinel], timeout=10)
        assert dying.exitcode is None                 # the window the race lived in
        vllm_plugin.note_gone_workers([SimpleNamespace(rank=1, proc=dying),
                                       SimpleNamespace(rank=0, proc=alive)])
        assert noted == [(1, 7)]
    finally:
        alive.kill()
        for proc in (dying, alive):
            proc.join(timeout=10)
