"""A caught exception in a job that then ended by itself, judged at its end: vLLM
0.32 shuts its engine down about a second after a worker's exception in
execute_model, before any stall limit passes, while the raiser's TP peer still
sits in the step's all-reduce (issue #24, done-when 3; the shape of a real run
dir of tests/test_vllm_states.py, rank 0 raising at its 4th call)."""
import json
import os
import shutil
import time

import pytest

from diagnose.analysis import analyze
from diagnose.analysis.crash import crash_of
from diagnose.cli.common import EXIT_CRASHED
from diagnose.core.snapshot import RaisedError
from diagnose.core.vocab import Phase, VerdictKind
from diagnose.launch.collector import Collector
from diagnose.launch.ending import judged_exit
from helpers.run import REPO, diag
from helpers.synthetic import Job, caught_exception, compiled_step, vllm_tp2

pytestmark = pytest.mark.unit


def summary(verdicts):
    return [(v.kind, v.culprit_ranks, v.victim_ranks) for v in verdicts]


def ended(job: Job, rank: int, at: float) -> None:
    """The process ended normally at `at` (vLLM's shutdown), its open phases closed."""
    state = job.ranks[rank]
    for event in state.open_phases:
        event.end = at
    state.open_phases = []
    job.phase(state, Phase.EXIT, at, at)
    state.alive, state.heartbeat_at = False, at


def peer_error(job: Job, rank: int, at: float, step: int) -> None:
    state = job.ranks[rank]
    state.error = RaisedError(pid=state.identity.pid, at=at, phase=Phase.EXECUTE_MODEL,
                              step=step, error="RuntimeError: Connection closed by peer",
                              frame="torch/_ops.py:875 __call__")


def raised_then_ended(peer_left_at: float | None) -> tuple[Job, float]:
    """tp=2: rank 0 raises in step 3, vLLM catches it and rank 0 goes back to its
    dequeue; rank 1 waits in the step's all-reduce. The engine shuts down: rank 0
    ends 1 s later; rank 1 leaves the step by gloo's "connection closed" at
    peer_left_at, or (None) is ended inside it; vLLM exits 0."""
    job, t = vllm_tp2(steps=3, now_after=6.0)
    job.driver_step(3, t, t + 0.06)
    caught_exception(job, t, 0, 3)
    if peer_left_at is None:
        compiled_step(job, 1, 3, t, None)
        job.ranks[1].alive, job.ranks[1].heartbeat_at = False, t + 1.5
    else:
        compiled_step(job, 1, 3, t, t + peer_left_at)
        peer_error(job, 1, t + peer_left_at, 3)
        ended(job, 1, t + peer_left_at + 0.8)
    ended(job, 0, t + 1.0)
    job.driver.alive, job.driver.heartbeat_at = False, t + 5.0
    job.command_exit = 0
    return job, t


@pytest.mark.parametrize("peer_left_at", [3.3, None])
def test_a_peer_left_waiting_in_the_step_until_the_job_ended_makes_the_exception_a_verdict(
        peer_left_at):
    job, t = raised_then_ended(peer_left_at)
    verdicts = analyze(job.snapshot())
    assert summary(verdicts) == [(VerdictKind.RAISED, [0], [1])]
    verdict = verdicts[0]
    assert "raised RuntimeError: injected by the plugin in execute_model step 3" in verdict.summary
    assert "rank 1 waited on it until the job ended" in verdict.summary
    crash = crash_of(job.snapshot())
    assert crash.rank == 0                                  # the same first failure
    assert judged_exit(verdicts, 0, crashed=True) == EXIT_CRASHED   # ended by itself


def test_while_the_job_runs_the_peer_s_short_wait_is_no_verdict_yet():
    """Before the end, the stall limit decides: 0.5 s in the all-reduce may be a slow step."""
    job, t = vllm_tp2(steps=3, now_after=0.5)
    job.driver_step(3, t, None)
    caught_exception(job, t, 0, 3)
    compiled_step(job, 1, 3, t, None)
    assert analyze(job.snapshot()) == []


def test_two_ranks_that_raised_in_the_same_step_are_a_crash_with_no_verdict():
    """Both TP ranks asserted (the vLLM crash case): neither waited on the other."""
    job, t = vllm_tp2(steps=3, now_after=6.0)
    job.driver_step(3, t, t + 0.06)
    caught_exception(job, t, 0, 3)
    caught_exception(job, t + 0.002, 1, 3)
    for rank in (0, 1):
        ended(job, rank, t + 1.0)
    job.driver.alive, job.driver.heartbeat_at = False, t + 2.0
    job.command_exit = 0
    assert analyze(job.snapshot()) == []
    assert crash_of(job.snapshot()).rank == 0


def test_a_peer_that_finished_the_step_waited_on_nothing():
    job, t = raised_then_ended(3.3)
    job.ranks[1].error = None                      # its step ended well: it needed no rank 0
    assert analyze(job.snapshot()) == []


def test_a_peer_that_raised_beside_it_after_its_last_heartbeat_waited_on_nothing():
    """The real vLLM case 5 run: rank 3's last heartbeat was 42 ms before its
    assert, rank 2 asserted 0.4 ms after it; both then went on to dequeue."""
    job, t = vllm_tp2(steps=3, now_after=6.0)
    job.driver_step(3, t, t + 0.06)
    caught_exception(job, t, 0, 3)
    caught_exception(job, t + 0.0004, 1, 3)
    for rank in (0, 1):
        ended(job, rank, t + 0.08)
        job.ranks[rank].heartbeat_at = t + 0.05 - 0.042
    job.driver.alive, job.driver.heartbeat_at = False, t + 2.0
    job.command_exit = 0
    assert analyze(job.snapshot()) == []


CRASHED_RUN = os.path.join(REPO, "tests", "fixtures", "runs", "vllm_crashed_exit0")


def test_a_finished_run_dir_read_hours_later_is_judged_as_it_ended(tmp_path):
    """The real vLLM 0.32 run dir of that case 5 (tp2 pp2, ranks 2 and 3 asserted in
    step 29, vLLM exited 0), read hours after it ended: its ranks' last waits are
    measured to the job's end, not to now. Measured to now, rank 0's 0.1 s wait on
    rank 2 had become 8,230 s and a second culprit, collective_missing_peers [2]."""
    run = diag("analyze", CRASHED_RUN, "--json")
    assert run.returncode == EXIT_CRASHED, run.stderr
    body = json.loads(run.stdout)
    assert body["verdicts"] == []
    assert body["crashed"]["rank"] == 3 and "AssertionError" in body["crashed"]["summary"]


def test_a_finished_job_is_judged_at_its_recorded_end_or_else_its_last_heartbeat(tmp_path):
    run = shutil.copytree(CRASHED_RUN, tmp_path / "run")
    last_beat = Collector(str(run)).snapshot().taken_at
    assert time.time() - last_beat > 3600       # the fixture is older than an hour
    exit_file = run / "exit.json"
    ending = json.loads(exit_file.read_text())
    exit_file.write_text(json.dumps(ending | {"ended_at": last_beat + 1.5}))
    assert Collector(str(run)).snapshot().taken_at == last_beat + 1.5
