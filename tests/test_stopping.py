"""The command stops the job itself: vLLM's API server, on SIGINT, kills its engine
core and workers at once (its default shutdown timeout is 0), before either can
enter a shutdown phase. Its hook says so first (stopping.json); the deaths that
follow are the stop, not a failure, while one that came before it stays one.
Synthetic snapshots of a vLLM-like tp=2 job, the probe's writer and the
collector's reader on a real run dir."""
import json
import os

import pytest

from diagnose import probe
from diagnose.analysis import analyze
from diagnose.analysis.crash import crash_of
from diagnose.core.snapshot import Stopping, WorkerExit
from diagnose.core.vocab import VerdictKind
from diagnose.launch.collector import Collector
from diagnose.probe import stopping
from helpers.synthetic import caught_exception, compiled_step, vllm_tp2

pytestmark = pytest.mark.unit


def killed(state, at: float) -> None:
    """Gone at `at`, its last heartbeat just before, nothing recorded."""
    state.alive, state.heartbeat_at = False, at - 0.04


def stopped_job(stop_in: float = 0.2):
    """Healthy steps, then the API server's stop at T and everything killed 10 ms later."""
    job, t = vllm_tp2(steps=5, now_after=0.0)
    for rank in job.ranks:
        job.dequeue(rank, t)                              # idle: waits for the next step
    at = t + stop_in
    job.now = at + 1.0
    snapshot = job.snapshot()
    for state in [job.driver, *job.ranks.values()]:
        killed(state, at + 0.01)
    return job, snapshot, at


def test_processes_killed_by_the_commands_own_stop_are_no_death():
    job, snapshot, at = stopped_job()
    assert [v.kind for v in analyze(snapshot)] != []     # without the stop: deaths
    snapshot.stopping = Stopping(at=at, pid=4242)
    assert analyze(snapshot) == []


def test_a_rank_dead_seconds_before_the_stop_is_still_the_culprit():
    job, snapshot, at = stopped_job(stop_in=5.0)
    killed(job.ranks[1], at - 3.0)
    snapshot.stopping = Stopping(at=at, pid=4242)
    verdicts = analyze(snapshot)
    assert [(v.kind, v.culprit_ranks) for v in verdicts] == [(VerdictKind.DEAD, [1])]


def test_a_worker_whose_exit_the_driver_saw_before_the_stop_is_dead_however_recent():
    job, snapshot, at = stopped_job()
    job.driver.worker_exits.append(WorkerExit(1, -9, at - 0.2))
    snapshot.stopping = Stopping(at=at, pid=4242)
    assert [(v.kind, v.culprit_ranks) for v in analyze(snapshot)] == [(VerdictKind.DEAD, [1])]


def test_workers_the_stop_killed_are_no_crash_of_a_job_that_exits_0():
    """The engine core may see its workers killed (SIGKILL) after the stop began."""
    job, snapshot, at = stopped_job()
    job.driver.worker_exits += [WorkerExit(0, -9, at + 0.02), WorkerExit(1, -9, at + 0.03)]
    snapshot.command_exit = 0
    assert crash_of(snapshot) is not None                 # without the stop: a crash
    snapshot.stopping = Stopping(at=at, pid=4242)
    assert crash_of(snapshot) is None
    job.driver.worker_exits[1] = WorkerExit(1, -9, at - 0.3)
    assert crash_of(snapshot).rank == 1


def test_a_stop_after_a_rank_raised_is_the_failures_end_not_a_stop():
    """vLLM's API server stops the engine after a worker's exception reached it:
    the exception is judged as the job ended, its peer left waiting in the step."""
    job, t = vllm_tp2(steps=3, now_after=0.0)
    job.driver_step(3, t, None)
    caught_exception(job, t, 0, 3)
    compiled_step(job, 1, 3, t, None)                     # rank 1 waits in the all-reduce
    at = t + 1.0
    job.now = at + 0.5
    snapshot = job.snapshot()
    for state in [job.driver, *job.ranks.values()]:
        killed(state, at + 0.01)
    snapshot.command_exit = 0
    snapshot.stopping = Stopping(at=at, pid=4242)
    verdicts = analyze(snapshot)
    assert [(v.kind, v.culprit_ranks, v.victim_ranks) for v in verdicts] == [
        (VerdictKind.RAISED, [0], [1])]
    assert crash_of(snapshot).rank == 0


def test_the_probe_says_the_first_stop_once(tmp_path, monkeypatch):
    monkeypatch.setenv(probe.RUN_DIR_VAR, str(tmp_path))
    stopping.began()
    path = tmp_path / stopping.STOPPING_FILE
    first = json.loads(path.read_text())
    stopping.began()
    assert json.loads(path.read_text()) == first
    assert first["pid"] == os.getpid() and isinstance(first["at"], float)
    assert sorted(os.listdir(tmp_path)) == [stopping.STOPPING_FILE]
    assert Collector(str(tmp_path)).snapshot().stopping == Stopping(first["at"], os.getpid())


def test_without_a_run_dir_or_with_one_gone_the_probe_says_nothing_and_never_raises(
        tmp_path, monkeypatch):
    monkeypatch.delenv(probe.RUN_DIR_VAR, raising=False)
    stopping.began()
    monkeypatch.setenv(probe.RUN_DIR_VAR, str(tmp_path / "gone"))
    stopping.began()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("text", ["{", "[]", '{"at": "soon", "pid": 1}', '{"at": 1.0}',
                                  '{"schema_version": 99, "at": 1.0, "pid": 1}'])
def test_a_malformed_stopping_file_is_refused_with_a_note(tmp_path, text):
    (tmp_path / stopping.STOPPING_FILE).write_text(text)
    collector = Collector(str(tmp_path))
    assert collector.snapshot().stopping is None
    assert any(note.startswith(f"{stopping.STOPPING_FILE}: ") for note in collector.refused)
