"""analyze() on hand-built snapshots of a tp=2 x pp=4 job (ranks 0..7, stages
[0,1] [2,3] [4,5] [6,7]); each scenario must name the right culprit."""
import json
from dataclasses import asdict

import pytest

from diagnose.analysis import analyze
from diagnose.core.layout import rank_list
from diagnose.core.vocab import STARTUP_PHASES
from diagnose.analysis.thresholds import StallLimits, ThresholdError, Thresholds
from helpers.synthetic import OP_S, Job

HANG_KINDS = {"never_reached", "stuck_in_phase", "collective_missing_peers",
              "broadcast_not_consumed", "dead"}


def only(verdicts, kind):
    assert [verdict.kind for verdict in verdicts] == [kind], [v.summary for v in verdicts]
    return verdicts[0]


def idle_after(job, rank, t):
    job.dequeue(rank, t)


def test_a_rank_stuck_in_startup_never_reaches_execute_model():
    job = Job(now=53.0)
    for rank in job.ranks:
        if rank != 6:
            job.startup(rank, 10.0)
    job.startup(6, 10.0, stop_in="init_kv_cache")            # open since 12.0
    job.driver_step(0, 15.0, None)
    for rank in (0, 1, 2, 3, 5):
        idle_after(job, rank, job.step(rank, 0, 15.02 + rank // 2 * 0.05))
    job.step(4, 0, 15.12, stop="pp_send")                    # 6 never posts its recv
    job.step(7, 0, 15.17, stop="forward")                    # tp3 all_reduce without rank 6
    job.ranks[6].frame = "engine/worker.py:88 init_kv_cache"

    verdict = only(analyze(job.snapshot()), "never_reached")
    assert verdict.culprit_ranks == [6]
    assert verdict.victim_ranks == [0, 1, 2, 3, 4, 5, 7]
    assert verdict.phase == "execute_model"                 # the phase it never reached
    assert verdict.evidence["open_phases"] == ["init_kv_cache"]
    assert verdict.detected_after_s == pytest.approx(41.0)
    assert verdict.evidence["frame"] == "engine/worker.py:88 init_kv_cache"
    assert verdict.summary == (
        "rank 6 (pp 3/4, tp 0) never reached execute_model: stuck in init_kv_cache for 41 s "
        "at engine/worker.py:88 init_kv_cache; ranks 0-5, 7 and the driver wait on it")


def test_a_rank_that_never_took_its_first_step_is_named_from_when_peers_started():
    job = Job(now=20.0)
    job.everyone_started()                                   # start-up ends at 14.0
    job.dequeue(6, 14.0)                                     # blocks, never reads
    job.driver_step(0, 15.0, None)
    for rank in (0, 1, 2, 3, 5):
        idle_after(job, rank, job.step(rank, 0, 15.02 + rank // 2 * 0.05))
    job.step(4, 0, 15.12, stop="pp_send")
    job.step(7, 0, 15.17, stop="forward")

    verdict = only(analyze(job.snapshot()), "never_reached")
    assert verdict.culprit_ranks == [6]
    assert verdict.phase == "execute_model"
    assert verdict.evidence["open_phases"] == ["dequeue[0]"]
    assert 4.5 < verdict.detected_after_s < 5.0              # since step 0 began, not since 14.0


def test_a_rank_hung_on_entering_a_start_up_phase_is_named_without_any_phase_open():
    """The engine's start-up RPCs: every worker reads init_kv_cache from the ring;
    rank 6's fault fires before the phase opens; the driver waits outside any phase."""
    job = Job(now=60.0)
    for rank in job.ranks:
        end = job.startup(rank, 10.0, stop_in="init_kv_cache")
        job.ranks[rank].phases.pop()
        job.ranks[rank].open_phases.clear()
        job.dequeue(rank, end, end + 1.0)                    # reads the init_kv_cache message
        job.ranks[rank].ring_read = 1
        if rank != 6:
            job.phase(job.ranks[rank], "init_kv_cache", end + 1.0, end + 2.0)
            job.dequeue(rank, end + 2.0)
    job.driver.ring_written = 1

    verdict = only(analyze(job.snapshot()), "never_reached")
    assert verdict.culprit_ranks == [6] and verdict.phase == "init_kv_cache"
    assert verdict.evidence["open_phases"] == []
    assert verdict.detected_after_s == pytest.approx(47.0)   # since it left dequeue at 13.0
    assert "never reached init_kv_cache: stuck after dequeue for 47 s" in verdict.summary
    job.now = 14.5       # 1.5 s after it took the message: under the steady-state floor
    assert analyze(job.snapshot()) == []
    job.now = 16.0       # nothing of the engine runs between dequeue and the next phase
    assert only(analyze(job.snapshot()), "never_reached").culprit_ranks == [6]


def hang_in_step_5(now_after: float, where: str = "forward_entry"):
    job = Job()
    t = job.healthy(5, job.everyone_started())
    job.driver_step(5, t, None)
    for rank in (0, 1, 2, 3):
        idle_after(job, rank, job.step(rank, 5, t + 0.02 + rank // 2 * 0.05))
    fired = job.step(4, 5, t + 0.12, stop=where)
    job.fault(4, f"rank=4,at={where.split('_')[0]},step=5,kind=hang", fired)
    if where == "forward_entry":
        job.step(5, 5, t + 0.12, stop="forward")             # tp2 all_reduce without rank 4
        job.step(7, 5, t + 0.17, stop="pp_recv")             # from 5, which waits on 4
    else:
        idle_after(job, 5, job.step(5, 5, t + 0.12))
        job.step(7, 5, t + 0.17, stop="forward")             # tp3 all_reduce without rank 6
    job.step(6, 5, t + 0.17, stop="pp_recv")                 # from 4, which never sends
    job.now = fired + now_after
    return job, fired


@pytest.mark.parametrize("where", ["forward_entry", "pp_send_entry"])
def test_b_rank_hung_inside_execute_model_is_the_culprit(where):
    job, fired = hang_in_step_5(4.0, where)
    verdict = only(analyze(job.snapshot()), "stuck_in_phase")
    assert verdict.culprit_ranks == [4]
    assert {5, 6, 7} <= set(verdict.victim_ranks)
    assert verdict.step == 5 and verdict.phase == "execute_model"
    assert verdict.detected_after_s == pytest.approx(job.now - fired)
    after = "pp_recv" if where == "forward_entry" else "forward"
    assert verdict.summary.startswith(
        f"rank 4 (pp 2/4, tp 0) stuck in execute_model after {after} at step 5 for 4 s")


def test_b_a_hung_job_that_was_then_killed_is_still_a_hang_post_mortem():
    job, fired = hang_in_step_5(4.0)
    for rank in job.ranks:
        job.ranks[rank].alive = False
        job.ranks[rank].heartbeat_at = fired + 4.0 + 0.01 * rank
    job.driver.alive = False
    job.driver.open_phases[-1].end = fired + 4.1             # closed by its SIGTERM handler
    job.driver.open_phases.clear()
    job.now = fired + 60.0

    verdict = only(analyze(job.snapshot()), "stuck_in_phase")
    assert verdict.culprit_ranks == [4]
    assert verdict.detected_after_s == pytest.approx(4.0)
    assert verdict.evidence["job_ended_s_ago"] == pytest.approx(56.0)


def test_b_a_stall_below_the_floor_is_not_yet_a_hang_unless_asked():
    job, _ = hang_in_step_5(1.0)
    assert analyze(job.snapshot()) == []
    verdict = only(analyze(job.snapshot(), Thresholds(stall_s=0.5)), "stuck_in_phase")
    assert verdict.culprit_ranks == [4]


def test_c_rank_that_skipped_an_all_reduce_is_the_culprit_despite_the_cycle():
    job = Job()
    t = job.healthy(4, job.everyone_started())
    job.driver_step(4, t, None)
    for rank in (0, 1, 2, 3):
        idle_after(job, rank, job.step(rank, 4, t + 0.02 + rank // 2 * 0.05))
    fired = t + 0.12 + 2 * OP_S
    job.fault(5, "rank=5,at=forward,step=4,kind=skip_collective", fired)
    idle_after(job, 5, job.step(5, 4, t + 0.12, stop="skip_allreduce"))  # on to dequeue
    job.step(4, 4, t + 0.12, stop="forward_second")          # its seq 9 pairs with nothing
    job.step(6, 4, t + 0.17, stop="pp_recv")
    job.step(7, 4, t + 0.17, stop="forward")
    job.now = fired + 3.0

    verdict = only(analyze(job.snapshot()), "collective_missing_peers")
    assert verdict.culprit_ranks == [5]
    assert (verdict.group, verdict.seq) == ("tp2", 9)
    assert max(r.seq for r in job.ranks[5].collectives if r.group == "tp2") == 8
    assert {4, 6, 7} <= set(verdict.victim_ranks)
    assert abs(verdict.detected_after_s - (job.now - fired)) < 0.1
    assert "never joined tp2 all_reduce seq 9" in verdict.summary


def test_d_first_rank_to_die_is_the_culprit_and_later_deaths_are_victims():
    job = Job()
    t = job.healthy(3, job.everyone_started())
    job.driver_step(3, t, None)
    for rank in job.ranks:
        if rank != 3:
            job.step(rank, 3, t + 0.02 + rank // 2 * 0.05, stop="pp_recv" if rank >= 2 else None)
    job.step(3, 3, t + 0.07, stop="pp_recv")
    job.died(2, t + 0.1, -9)
    for rank in job.ranks:
        if rank != 2:
            job.died(rank, t + 1.0, -15)                     # the engine's shutdown
    job.now = t + 2.0

    verdict = only(analyze(job.snapshot()), "dead")
    assert verdict.culprit_ranks == [2]
    assert verdict.victim_ranks == [0, 1, 3, 4, 5, 6, 7]
    assert verdict.evidence["signal"] == 9 and verdict.evidence["exitcode"] == -9
    assert verdict.detected_after_s == pytest.approx(1.9)
    assert "killed by signal 9, SIGKILL" in verdict.summary


def test_d_live_ranks_waiting_on_a_dead_one_are_victims():
    job = Job()
    t = job.healthy(3, job.everyone_started())
    job.driver_step(3, t, None)
    for rank in (0, 1):
        idle_after(job, rank, job.step(rank, 3, t + 0.02))
    job.step(2, 3, t + 0.07, stop="forward_entry")
    job.step(3, 3, t + 0.07, stop="forward")
    for rank in (4, 5, 6, 7):
        job.step(rank, 3, t + 0.12, stop="pp_recv")
    job.ranks[2].alive = False                               # no exit record: heartbeat dates it
    job.ranks[2].heartbeat_at = t + 0.1
    job.now = t + 3.0

    verdict = only(analyze(job.snapshot()), "dead")
    assert verdict.culprit_ranks == [2]
    assert verdict.victim_ranks == [0, 1, 3, 4, 5, 6, 7]
    assert verdict.evidence["exitcode"] is None


def test_a_dead_driver_is_the_culprit_of_workers_waiting_for_its_broadcast():
    job = Job()
    t = job.healthy(3, job.everyone_started())
    for rank in job.ranks:
        job.dequeue(rank, t)
    job.driver.alive = False
    job.driver.heartbeat_at = t + 1.0
    job.command_exit = -11
    job.now = t + 3.0

    verdict = only(analyze(job.snapshot()), "dead")
    assert verdict.culprit_ranks == [] and verdict.evidence["culprit"] == "driver"
    assert verdict.victim_ranks == list(range(8))
    assert verdict.summary.startswith("the driver died 2 s ago (killed by signal 11, SIGSEGV)")


def test_a_clean_shutdown_is_no_verdict():
    job = Job()
    t = job.healthy(3, job.everyone_started())
    for rank in job.ranks:
        job.died(rank, t + 1.0, 0)
    job.command_exit = 0
    job.now = t + 5.0
    assert analyze(job.snapshot()) == []


def test_a_worker_killed_before_the_job_shut_itself_down_is_dead_though_it_exits_0():
    """vLLM shuts down after losing a worker and its API server exits 0: the
    driver saw the worker fail before the shutdown, so it is still the culprit."""
    job = Job()
    t = job.healthy(3, job.everyone_started())
    job.died(1, t + 0.1, -9)
    job.phase(job.driver, "shutdown", t + 0.3)
    for rank in job.ranks:
        if rank != 1:
            job.ranks[rank].alive = False
            job.ranks[rank].heartbeat_at = t + 0.5
    job.command_exit = 0
    job.now = t + 2.0
    verdict = only(analyze(job.snapshot()), "dead")
    assert verdict.culprit_ranks == [1]
    assert verdict.evidence["signal"] == 9


def test_ranks_leaving_while_the_driver_shuts_down_are_no_verdict():
    """Workers that exit (or linger in their exit path) once the driver began its
    shutdown went because they were told to."""
    job = Job()
    t = job.healthy(3, job.everyone_started())
    job.phase(job.driver, "shutdown", t + 0.5)
    for rank in range(4):
        job.ranks[rank].alive = False
        job.ranks[rank].heartbeat_at = t + 0.6
    job.now = t + 5.0
    assert analyze(job.snapshot()) == []


def test_a_hang_stopped_by_a_shutdown_is_judged_from_before_it():
    """diag launch stopped a job whose rank 6 never reached execute_model: every
    process then went, the driver last; the hang is still what is named."""
    job = Job(now=90.0)
    for rank in job.ranks:
        if rank != 6:
            job.startup(rank, 10.0)
    job.startup(6, 10.0, stop_in="init_kv_cache")
    job.driver_step(0, 15.0, None)
    for rank in (0, 1, 2, 3, 5):
        idle_after(job, rank, job.step(rank, 0, 15.02 + rank // 2 * 0.05))
    job.step(4, 0, 15.12, stop="pp_send")
    job.step(7, 0, 15.17, stop="forward")
    job.phase(job.driver, "shutdown", 60.0)
    for rank in job.ranks:
        job.ranks[rank].alive = False
        job.ranks[rank].heartbeat_at = 60.2
    job.driver.alive = False
    job.driver.heartbeat_at = 61.0
    verdict = only(analyze(job.snapshot()), "never_reached")
    assert verdict.culprit_ranks == [6]


def straggler_job():
    job = Job()
    t = job.everyone_started()
    for step in range(6):
        job.driver_step(step, t, t + 1.6)
        for rank in job.ranks:
            stage_start = t + 0.01 + rank // 2 * 0.04
            if rank == 7:
                job.step(rank, step, stage_start, work_s=1.5)       # the sleep
            elif rank == 6:
                job.step(rank, step, stage_start, allreduce_wait=1.5)
            else:
                job.step(rank, step, stage_start)
        t += 1.62
    job.driver_step(6, t, None)
    for rank in range(6):
        idle_after(job, rank, job.step(rank, 6, t + 0.01 + rank // 2 * 0.04))
    job.step(6, 6, t + 0.13, stop="forward")
    job.step(7, 6, t + 0.13, stop="forward_entry", work_s=1.5)
    job.now = t + 1.2
    return job


def test_e_a_slow_but_progressing_rank_is_a_straggler_not_a_hang():
    verdict = only(analyze(straggler_job().snapshot()), "straggler")
    assert verdict.culprit_ranks == [7]
    assert verdict.victim_ranks == [6]
    assert verdict.evidence["peer_median_s"] < 0.1
    assert all(seconds > 1.4 for seconds in verdict.evidence["own_step_s"].values())


def test_f_rank_that_stops_reading_the_broadcast_is_the_culprit():
    job = Job()
    t = job.healthy(6, job.everyone_started())
    job.dequeue(3, t - 0.01)                                  # skip_broadcast: blocks in dequeue
    job.fault(3, "rank=3,at=dequeue,step=6,kind=skip_broadcast", t - 0.01)
    job.driver_step(6, t, None)
    for rank in (0, 1):
        idle_after(job, rank, job.step(rank, 6, t + 0.02))
    job.step(2, 6, t + 0.07, stop="forward")
    for rank in (4, 5, 6, 7):
        job.step(rank, 6, t + 0.12, stop="pp_recv")
    job.now = t + 4.0

    verdict = only(analyze(job.snapshot()), "broadcast_not_consumed")
    assert verdict.culprit_ranks == [3]
    assert {2, 4, 5, 6, 7} <= set(verdict.victim_ranks)
    assert job.ranks[3].ring_read == 6 and job.driver.ring_written == 7
    assert abs(verdict.detected_after_s - 4.0) < 0.1
    assert "read 6 of 7 messages" in verdict.summary


def test_g_healthy_traffic_with_a_slow_first_step_and_a_long_prefill_gives_no_verdict():
    job = Job()
    t = job.everyone_started()
    # A slow first step: stage 0 compiles for 9 s before any collective; the
    # snapshot is taken inside it.
    job.driver_step(0, t, None)
    for rank in (0, 1):
        job.step(rank, 0, t + 0.01, stop="forward_entry")
    for rank in range(2, 8):
        job.step(rank, 0, t + 0.01, stop="pp_recv")
    job.now = t + 9.0
    assert analyze(job.snapshot()) == []


def test_g_a_long_prefill_that_keeps_completing_collectives_is_not_stalled():
    job = Job()
    t = job.healthy(5, job.everyone_started())
    job.driver_step(5, t, None)
    for rank in (0, 1, 2, 3):
        idle_after(job, rank, job.step(rank, 5, t + 0.02 + rank // 2 * 0.05))
    for rank in (4, 5):                                        # 3 s of layers, 0.3 s each
        start = job.step(rank, 5, t + 0.12, stop="forward_entry")
        job.phase(job.ranks[rank], "forward", start)
        for layer in range(10):
            job.record(rank, "tp2", "all_reduce", start + 0.3 * layer, start + 0.3 * layer + 0.29)
    for rank in (6, 7):
        job.step(rank, 5, t + 0.17, stop="pp_recv")
    job.now = t + 0.12 + 3.1
    assert analyze(job.snapshot()) == []


def test_h_an_idle_server_gives_no_verdict():
    job = Job()
    t = job.healthy(5, job.everyone_started())
    for rank in job.ranks:
        job.dequeue(rank, t)
    job.now = t + 600.0
    assert analyze(job.snapshot()) == []


def test_members_that_disagree_on_a_collective_are_a_mismatch():
    job = Job(tp=4, pp=1)
    t = job.everyone_started()
    job.driver_step(0, t, None)
    for rank in (0, 1, 3):
        job.record(rank, "tp0", "all_reduce", t, None)
    job.record(2, "tp0", "all_reduce", t, None, shape=[4, 32])
    job.now = t + 0.1

    verdict = analyze(job.snapshot())[0]
    assert verdict.kind == "collective_mismatch"
    assert verdict.culprit_ranks == [2] and verdict.victim_ranks == [0, 1, 3]
    assert (verdict.group, verdict.seq) == ("tp0", 0)
    assert "rank 2: all_reduce [[4, 32]] float32" in verdict.summary


def test_verdicts_are_json_serialisable():
    job, _ = hang_in_step_5(4.0)
    text = json.dumps([asdict(verdict) for verdict in analyze(job.snapshot())])
    assert json.loads(text)[0]["culprit_ranks"] == [4]


def test_rank_list_is_compact():
    assert rank_list([3]) == "rank 3"
    assert rank_list([7, 0, 1, 2, 3, 4, 5]) == "ranks 0-5 and 7"
    assert rank_list([0, 1, 3, 5, 6]) == "ranks 0-1, 3 and 5-6"
    assert rank_list([0, 1, 2], driver=True) == "ranks 0-2 and the driver"


def test_thresholds_parse_auto_or_seconds():
    assert Thresholds.parse("auto") == Thresholds()
    assert Thresholds.parse("2.5").stall_s == 2.5
    for bad in ("-1", "soon", "nan", "inf", ""):
        with pytest.raises(ThresholdError):
            Thresholds.parse(bad)


def test_auto_limits_give_start_up_far_more_time_than_a_step():
    job = Job()
    job.healthy(5, job.everyone_started(seconds=3.0))
    limits = StallLimits(job.snapshot(), Thresholds())
    assert all(limits.limit(name) >= 20.0 for name in STARTUP_PHASES)
    assert limits.limit("execute_model") == 2.0                # steps of 0.1 s: the floor
    assert limits.limit("never_seen") == 20.0                  # no finished instance yet
    assert StallLimits(job.snapshot(), Thresholds(stall_s=7)).limit("load_weights") == 7
