"""The analysis when the collectives a rank waits in are out of the probe's sight,
as in vLLM, whose TP all-reduce runs inside its compiled model: synthetic
snapshots of that shape (execute_model phases, no collective records)."""
from diagnose.analysis import analyze
from diagnose.core.vocab import Phase
from helpers.synthetic import OP_S, Job, compiled_step, vllm_tp2


def test_the_peer_a_step_behind_is_named_not_the_rank_waiting_inside_the_compiled_model():
    job, t = vllm_tp2(steps=3, now_after=3.0)
    job.driver_step(3, t, None)
    compiled_step(job, 1, 3, t, None)                     # waits inside the compiled all-reduce
    job.dequeue(0, t, t + OP_S)                            # took the message, then blocked
    job.ranks[0].ring_read += 1

    verdicts = analyze(job.snapshot())
    assert [(v.kind, v.culprit_ranks, v.victim_ranks) for v in verdicts] == [
        ("never_reached", [0], [1])]
    assert verdicts[0].step == 3 and verdicts[0].phase == "execute_model"
    assert "never reached execute_model step 3" in verdicts[0].summary
    assert "rank 1 and the driver wait on it" in verdicts[0].summary


def test_a_rank_waiting_on_a_peer_that_still_compiles_is_no_hang():
    job = Job(tp=2, pp=1)
    for rank in (0, 1):
        job.startup(rank, 10.0, stop_in=Phase.WARMUP)
    job.now = 10.0 + 3 + 60.0                               # a minute into warm-up
    job.ranks[1].frame_moved_at = job.now - 0.2            # rank 1 compiles: its frame moves
    assert analyze(job.snapshot()) == []


def test_a_start_up_phase_whose_frame_moves_is_no_hang():
    job = Job(tp=1, pp=1)
    job.startup(0, 10.0, stop_in=Phase.INIT_KV_CACHE)
    job.now = 10.0 + 2 + 60.0
    job.ranks[0].frame_moved_at = job.now - 0.3
    assert analyze(job.snapshot()) == []
    job.ranks[0].frame_moved_at = None                     # a post-mortem: nothing seen move
    assert [v.culprit_ranks for v in analyze(job.snapshot())] == [[0]]


def test_peers_both_stuck_in_warm_up_are_one_verdict_that_claims_no_collective():
    job = Job(tp=2, pp=1)
    for rank in (0, 1):
        job.startup(rank, 10.0, stop_in=Phase.WARMUP)
    job.now = 10.0 + 3 + 60.0
    verdicts = analyze(job.snapshot())
    assert [(v.kind, v.culprit_ranks) for v in verdicts] == [("stuck_in_phase", [0, 1])]
    assert "none in a collective the probe can see" in verdicts[0].summary


def test_healthy_compiled_steps_give_no_verdict():
    job, t = vllm_tp2(steps=20, now_after=0.05)
    job.driver_step(20, t, None)
    compiled_step(job, 1, 20, t, None)                     # rank 0 not there yet: 50 ms
    assert analyze(job.snapshot()) == []


def test_a_rank_the_host_did_not_run_for_a_moment_is_not_stuck_but_a_long_freeze_is():
    job = Job(tp=1, pp=1)
    t = job.healthy(5, job.everyone_started())
    job.driver_step(5, t, None)
    job.step(0, 5, t, stop="in_forward")
    job.now = t + 3.1                                      # a 10-90 ms forward took 3.1 s,
    snapshot = job.snapshot()
    snapshot.ranks[0].heartbeat_at = job.now - 1.4         # 1.4 s of it unscheduled
    assert analyze(snapshot) == []

    job.now = t + 12.0                                     # frozen 10 s: a GIL held, SIGSTOP
    snapshot = job.snapshot()
    snapshot.ranks[0].heartbeat_at = t + 2.0
    assert [(v.kind, v.culprit_ranks) for v in analyze(snapshot)] == [("stuck_in_phase", [0])]
