"""A caught exception in a job that then ended by itself, judged at its end: vLLM
0.32 shuts its engine down about a second after a worker's exception in
execute_model, before any stall limit passes, while the raiser's TP peer still
sits in the step's all-reduce (issue #24, done-when 3; the shape of a real run
dir of tests/test_vllm_states.py, rank 0 raising at its 4th call)."""
import json
import os
import shutil
import time
from dataclasses import replace

import pytest

from diagnose.analysis import analyze
from diagnose.analysis.crash import crash_of
from diagnose.analysis.timeline import rewind
from diagnose.cli.common import EXIT_CRASHED, EXIT_VERDICTS
from diagnose.core.snapshot import RaisedError
from diagnose.core.vocab import Phase, VerdictKind
from diagnose.launch.collector import Collector
from diagnose.launch.ending import judged_exit
from helpers.run import REPO, diag
from helpers.synthetic import OP_S, Job, caught_exception, compiled_step, vllm_tp2

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


def exited_while_workers_ran(peer_entered_after: float) -> tuple[Job, float]:
    """vllm serve exited 1 s after rank 0's exception while both workers still ran:
    rank 0 back in its dequeue, rank 1 in step 3's all-reduce, which it entered
    `peer_entered_after` s after rank 0's exception (negative: before it)."""
    job, t = vllm_tp2(steps=3, now_after=0.0)
    job.driver_step(3, t, t + 0.06)
    caught_exception(job, t, 0, 3)
    raised_at = job.ranks[0].error.at
    compiled_step(job, 1, 3, raised_at + peer_entered_after - OP_S, None)
    job.now = raised_at + 1.0
    for state in job.ranks.values():
        state.heartbeat_at = job.now - 0.07
    job.driver.alive, job.driver.heartbeat_at = False, raised_at + 0.09
    job.command_exit = 0
    return job, t


@pytest.mark.parametrize("peer_entered_after", [-0.001, 0.002])
def test_vllm_exiting_while_the_peer_still_waits_in_the_step_makes_the_exception_a_verdict(
        peer_entered_after):
    """The shape of the real run dir below at the moment diag judged it: nobody's
    process had ended yet. The peer may enter the step just after the raiser's
    exception (the two take the same broadcast within a millisecond)."""
    job, t = exited_while_workers_ran(peer_entered_after)
    verdicts = analyze(job.snapshot())
    assert summary(verdicts) == [(VerdictKind.RAISED, [0], [1])]
    assert "it went on and is now in dequeue" in verdicts[0].summary
    assert "rank 1 waited on it until the job ended" in verdicts[0].summary
    assert verdicts[0].detected_after_s == 1.0
    assert crash_of(job.snapshot()).rank == 0


def test_the_job_s_end_while_both_still_run_is_still_no_verdict_if_the_peer_finished_the_step():
    job, t = exited_while_workers_ran(-0.001)
    step = job.ranks[1].open_phases[-1]
    step.end = step.start + 0.05
    job.ranks[1].open_phases = []
    assert analyze(job.snapshot()) == []


def test_two_ranks_that_raised_in_the_same_step_and_still_run_at_the_end_are_no_verdict():
    """vLLM's crash case judged the moment vllm serve exited: both asserted and went
    back to their dequeue, alive."""
    job, t = exited_while_workers_ran(-0.001)
    job.ranks[1].open_phases, job.ranks[1].phases = [], job.ranks[1].phases[:-2]
    caught_exception(job, t + 0.0004, 1, 3)
    assert analyze(job.snapshot()) == []


def test_a_peer_ended_inside_the_step_just_before_the_raiser_s_last_beat_waited_on_it():
    """vLLM's executor ends both workers at once: the peer's last heartbeat may come
    a beat before the raiser's last sign of life; it never left the step."""
    job, t = exited_while_workers_ran(-0.001)
    raised_at = job.ranks[0].error.at
    ended(job, 0, raised_at + 1.0)
    job.ranks[1].alive, job.ranks[1].heartbeat_at = False, raised_at + 0.93
    job.now = raised_at + 1.2
    assert summary(analyze(job.snapshot())) == [(VerdictKind.RAISED, [0], [1])]


def test_a_peer_that_entered_the_step_just_after_the_exception_and_was_ended_in_it_waited():
    """The numbers of a real vLLM run (17:20, the first of the stress runs): rank 1
    entered step 3 41 us after rank 0's exception; vLLM ended both workers without
    their exit phase (rank 0's last heartbeat 31 ms before its exception, rank 1's
    141 ms after it); vllm serve exited 2.54 s after it, so the stall limit named it.
    Had it exited within 2 s, as on a quiet machine, nothing was named."""
    job, t = exited_while_workers_ran(0.000041)
    raised_at = job.ranks[0].error.at
    job.ranks[0].alive, job.ranks[0].heartbeat_at = False, raised_at - 0.031
    job.ranks[1].alive, job.ranks[1].heartbeat_at = False, raised_at + 0.141
    job.now = raised_at + 1.5
    verdicts = analyze(job.snapshot())
    assert summary(verdicts) == [(VerdictKind.RAISED, [0], [1])]
    assert verdicts[0].detected_after_s == 0.141


RAISED_RUN = os.path.join(REPO, "tests", "fixtures", "runs", "vllm_raised_exit0")


def test_the_real_run_that_gave_no_verdict_gives_raised_as_diag_launch_judged_it():
    """The real vLLM 0.32 run dir of tests/test_vllm_states.py's caught exception
    that had no verdict (tp=2, rank 0 raised at its 4th execute_model, 12:46): its
    report's rank rows say both workers still ran when diag judged (heartbeats 71 and
    82 ms old), the moment `vllm serve` exited, about 1.0 s after the exception (rank
    0's last heartbeat came at +0.94 s, its exit, by diag's stop, at +1.03 s).
    Rewound to then: rank 0 in no phase after its dequeue, rank 1 in step 3."""
    snapshot = Collector(RAISED_RUN).snapshot()
    raised_at = snapshot.ranks[0].error.at
    rows = json.loads(open(os.path.join(RAISED_RUN, "report.json")).read())["ranks"]
    assert [(row["phase"], row["step"], row["heartbeat_age_s"] < 0.1) for row in rows] == [
        (None, 4, True), ("execute_model", 3, True)]
    judged = replace(rewind(snapshot, raised_at + 1.0), command_exit=0)
    judged.driver.alive = False                 # its last heartbeat: +0.09 s
    verdicts = analyze(judged)
    assert summary(verdicts) == [(VerdictKind.RAISED, [0], [1])]
    assert "hs_test_faults: rank 0 raised at call 4" in verdicts[0].summary
    assert "rank 1 waited on it until the job ended" in verdicts[0].summary


def test_the_real_run_dir_read_later_gives_raised_too():
    run = diag("analyze", RAISED_RUN, "--json")
    assert run.returncode == EXIT_VERDICTS, run.stderr
    body = json.loads(run.stdout)
    assert [(v["kind"], v["culprit_ranks"], v["victim_ranks"]) for v in body["verdicts"]] == [
        ("raised", [0], [1])]
    assert body["crashed"]["rank"] == 0


CRASHED_RUN = os.path.join(REPO, "tests", "fixtures", "runs", "vllm_crashed_exit0")


def test_a_finished_run_dir_read_hours_later_is_judged_as_it_ended():
    """The real vLLM 0.32 run dir of that case 5 (tp2 pp2, ranks 2 and 3 asserted in
    step 29, vLLM exited 0), read hours after it ended: its ranks' last waits are
    measured to the job's end, not to now. Measured to now, rank 0's 0.1 s wait on
    rank 2 had become 8,230 s and a second culprit, collective_missing_peers [2]."""
    run = diag("analyze", CRASHED_RUN, "--json")
    assert run.returncode == EXIT_CRASHED, run.stderr
    body = json.loads(run.stdout)
    assert body["verdicts"] == []
    assert body["crashed"]["rank"] == 3 and "AssertionError" in body["crashed"]["summary"]


def test_a_finished_job_is_judged_at_its_recorded_end_or_else_its_last_sign_of_life(tmp_path):
    run = shutil.copytree(CRASHED_RUN, tmp_path / "run")
    last_beat = Collector(str(run)).snapshot().taken_at
    assert time.time() - last_beat > 3600       # the fixture is older than an hour
    exit_file = run / "exit.json"
    ending = json.loads(exit_file.read_text())
    exit_file.write_text(json.dumps(ending | {"ended_at": last_beat + 1.5}))
    assert Collector(str(run)).snapshot().taken_at == last_beat + 1.5
