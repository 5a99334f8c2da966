"""What each rank is doing, read by diag launch from real processes (py-spy): a real
gloo job whose all-reduce the probe cannot see (tests/programs/gloo_states.py),
and our engine with a rank that raises inside execute_model."""
import subprocess
import sys
import time

import pytest

from helpers.run import ENGINE, PROMPTS, launch

pytestmark = pytest.mark.e2e

PROGRAM = [sys.executable, "tests/programs/gloo_states.py"]


def launch_states(tmp_path, command: list[str], *flags: str, timeout: int = 300) -> dict:
    return launch(tmp_path, command, *flags, timeout=timeout,
                  env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}).body()


def kinds(body: dict) -> list[tuple[str, list[int], list[int]]]:
    return [(v["kind"], v["culprit_ranks"], v["victim_ranks"]) for v in body["verdicts"]]


def test_a_rank_sleeping_in_its_step_is_the_culprit_and_its_waiting_peer_a_victim(tmp_path):
    body = launch_states(tmp_path, PROGRAM + ["sleep"])
    assert kinds(body)[:1] == [("stuck_in_phase", [0], [1])], body["stderr"][-3000:]
    assert all(verdict["culprit_ranks"] == [0] for verdict in body["verdicts"])
    states = body["verdicts"][0]["evidence"]["states"]
    assert states["1"].startswith("collective"), states
    assert not states["0"].startswith("collective"), states


def test_a_caught_exception_is_the_culprit_with_the_exception_named(tmp_path):
    body = launch_states(tmp_path, PROGRAM + ["raise"])
    assert kinds(body) == [("raised", [0], [1])], body["stderr"][-3000:]
    verdict = body["verdicts"][0]
    assert "RuntimeError: rank 0 failed inside its step (gloo_states raise)" in verdict["summary"]
    assert verdict["evidence"]["error"]["frame"].startswith("programs/gloo_states.py:")
    assert verdict["step"] == 3


def test_a_compile_inside_a_step_is_progress_not_a_hang(tmp_path):
    body = launch_states(tmp_path, PROGRAM + ["compile"], timeout=500)
    assert body["verdicts"] == [], body["stderr"][-3000:]
    assert body["exit_code"] == 0 and body["command_exit"] == 0
    assert body["crashed"] is None


def test_our_engine_a_rank_raising_inside_execute_model_is_raised_with_its_exception(tmp_path):
    body = launch_states(tmp_path, ENGINE[:6] + ["-tp", "2", "-pp", "1", "--ignore-eos", *PROMPTS[:2]],
                  "--fault", "rank=1,at=execute_model,step=3,kind=raise")
    culprits = [(kind, culprit) for kind, culprit, _ in kinds(body)]
    assert culprits == [("raised", [1])], body["stderr"][-3000:]
    verdict = body["verdicts"][0]
    assert "FaultRaised" in verdict["summary"] and verdict["step"] == 3
    assert verdict["evidence"]["error"]["frame"].startswith("worker/worker.py")   # the engine's


SLEEPER = ("import time\ndef wait_for_service():\n    time.sleep(600)\n"
           "print('READY', flush=True)\nwait_for_service()\n")
COMPILER_PARENT = ("import subprocess, sys, time\n"
                   "g = subprocess.Popen(['g++', '-x', 'c++', '-c', '-', '-o', '/dev/null'],"
                   " stdin=subprocess.PIPE)\n"
                   "print('READY', flush=True)\n"
                   "g.wait()\n")


def _started(source: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", source], stdout=subprocess.PIPE, text=True)
    if "READY" in source:
        assert proc.stdout.readline().strip() == "READY"
    return proc


def test_the_sampler_reads_a_sleeping_process_with_native_frames(tmp_path):
    from diagnose.core.snapshot import Snapshot
    from diagnose.launch.states import StateSampler
    proc = _started(SLEEPER)
    sampler = StateSampler(str(tmp_path))
    try:
        time.sleep(1.0)
        sampler.sample(0, proc.pid)
        sample = sampler.sample(0, proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert sample.activity == "sleeping" and sample.native, sample
    assert sample.frame.startswith("[native] ") and "sleep" in sample.frame
    assert any("wait_for_service" in frame for frame in sample.frames)
    assert not sample.busy                         # blocked: no CPU between its samples
    # each native dump stopped the process: the pauses go to the analysis
    paused = sampler.seen(Snapshot(taken_at=time.time(), run_dir=str(tmp_path),
                                   ranks={})).paused
    assert len(paused) == 2 and all(p.start <= p.end for p in paused)


def test_a_process_computing_between_two_samples_is_busy(tmp_path):
    from diagnose.launch.states import StateSampler
    proc = _started("print('READY', flush=True)\nwhile True:\n    pass\n")
    sampler = StateSampler(str(tmp_path))
    try:
        first = sampler.sample(0, proc.pid)
        time.sleep(1.0)
        second = sampler.sample(0, proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert not first.busy and second.busy       # the first has nothing to compare with
    assert second.activity == "running"


def test_a_real_compiler_child_makes_the_rank_compiling_whatever_its_stack(tmp_path):
    """g++ reading its source from a pipe that stays open: cc1plus runs, blocked."""
    from diagnose.launch.states import StateSampler
    proc = _started(COMPILER_PARENT)
    sampler = StateSampler(str(tmp_path))
    try:
        first = sampler.sample(0, proc.pid)
        second = sampler.sample(0, proc.pid)
    finally:
        for child in __import__("psutil").Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        proc.wait()
    assert first.activity == second.activity == "compiling", first
    assert first.rule == "compile-child" and ("g++" in first.frame or "cc1plus" in first.frame)
    assert second.compiling_since == first.compiling_since == first.taken_at


def _worker_parent(work: str) -> str:
    """A process with one child whose command line says compile_worker, doing `work`."""
    return ("import subprocess, sys, time\n"
            f"w = subprocess.Popen([sys.executable, '-c', {work!r}, 'compile_worker'])\n"
            "print('READY', flush=True)\n"
            "w.wait()\n")


NIBBLING = ("import time\nwhile True:\n    end = time.process_time() + 0.004\n"
            "    while time.process_time() < end: pass\n    time.sleep(0.5)\n")
SPINNING = "while True: pass\n"


@pytest.mark.parametrize("work,compiling", [(NIBBLING, False), (SPINNING, True)],
                         ids=["idle", "busy"])
def test_an_idle_compile_worker_is_no_compile_a_busy_one_is(work, compiling):
    """Inductor's pool outlives every compile, and an idle worker still wakes now
    and then: a few milliseconds of CPU a second are no compile, a worker at work is."""
    import psutil

    from diagnose.launch.states import compiler_child
    proc = _started(_worker_parent(work))
    worker_cpu: dict = {}
    try:
        time.sleep(0.5)
        assert compiler_child(proc.pid, worker_cpu) is None     # nothing to compare with yet
        time.sleep(3.0)
        found = compiler_child(proc.pid, worker_cpu)
    finally:
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        proc.wait()
    assert (found is not None) == compiling, found
    if compiling:
        assert found.startswith("an Inductor compile worker (pid ")
