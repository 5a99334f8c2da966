"""The analysis with what each rank is doing (RankState.activity, the samples diag
launch takes with py-spy) and the first exception each rank raised
(RankState.error): the hangs of issue #24, as synthetic snapshots of a vLLM-like
job whose TP all-reduce runs out of the probe's sight (a compiled model)."""
import pytest

from diagnose.analysis import analyze
from diagnose.analysis.doing import SAMPLE_WAIT_S
from diagnose.analysis.thresholds import Thresholds
from diagnose.core.snapshot import ActivitySample, Pause, RaisedError
from diagnose.core.vocab import Activity, Phase, VerdictKind
from diagnose.offline.report import rank_rows
from helpers.synthetic import Job, caught_exception, compiled_step, vllm_tp2

pytestmark = pytest.mark.unit

IN_ALL_REDUCE = ["v1/worker/gpu_worker.py:300 execute_model", "ab/cabc.py:40 call",
                 "distributed/parallel_state.py:740 all_reduce",
                 "device_communicators/cpu_communicator.py:275 all_reduce"]
SLEEPING = ["v1/worker/gpu_worker.py:300 execute_model", "tests/plugin.py:20 block",
            "[native] libpython3.11.so time_sleep", "[native] libc.so.6 clock_nanosleep"]
COMPILING = ["v1/worker/gpu_worker.py:300 execute_model",
             "_dynamo/convert_frame.py:900 _compile", "_inductor/cpp_builder.py:300 build",
             "python3.11/subprocess.py:1200 communicate"]
IDLE = ["v1/executor/multiproc_executor.py:700 worker_busy_loop",
        "device_communicators/shm_broadcast.py:970 dequeue"]


def sample(job: Job, rank: int, activity: Activity, frames: list[str], at: float,
           compiling_since: float | None = None, compiled_at: float | None = None) -> None:
    job.ranks[rank].activity = ActivitySample(
        activity=activity, taken_at=at, pid=job.ranks[rank].identity.pid, frame=frames[-1],
        rule="test", frames=frames, native=True, compiling_since=compiling_since,
        compiled_at=compiled_at)


def both_inside_step(stall_s: float = 3.0) -> tuple[Job, float]:
    """tp=2: three healthy steps, then both ranks inside step 3 (the driver waits)."""
    job, t = vllm_tp2(steps=3, now_after=stall_s)
    job.driver_step(3, t, None)
    for rank in (0, 1):
        compiled_step(job, rank, 3, t, None)
    return job, t


def summary(verdicts):
    return [(v.kind, v.culprit_ranks, v.victim_ranks) for v in verdicts]


def test_without_states_both_ranks_inside_the_step_share_one_verdict():
    """The tie #24 reported: by positions alone, neither waits on the other. One
    of them holds the other, and nothing says which: one verdict names both, never
    each as the one culprit."""
    job, _ = both_inside_step()
    verdicts = analyze(job.snapshot())
    assert summary(verdicts) == [(VerdictKind.STUCK_IN_PHASE, [0, 1], [])]
    assert verdicts[0].summary.startswith(
        "ranks 0-1 are both stuck in execute_model at step 3 for 3 s with nothing pending: "
        "one of them holds the other, and nothing they were seen doing says which"), \
        verdicts[0].summary
    assert "the driver waits on them" in verdicts[0].summary
    assert set(verdicts[0].evidence["each"]) == {"0", "1"}


def test_four_tp_peers_tied_in_the_step_share_one_verdict():
    """tp=4, all inside step 3 with nothing pending; rank 2 is seen waiting in the
    all-reduce, the others are not sampled. A rank seen waiting waits only on peers
    seen doing something else (graph.py), so all four stay roots: one verdict names
    them, and its states say which of them was seen waiting."""
    job = Job(tp=4, pp=1)
    t = job.everyone_started()
    for step in range(3):
        job.driver_step(step, t, t + 0.1)
        for rank in range(4):
            compiled_step(job, rank, step, t, t + 0.09)
        t += 0.12
    job.driver_step(3, t, None)
    for rank in range(4):
        compiled_step(job, rank, 3, t, None)
    job.now = t + 3.0
    sample(job, 2, Activity.COLLECTIVE, IN_ALL_REDUCE, t + 1.5)
    verdicts = analyze(job.snapshot())
    assert [(v.kind, v.culprit_ranks) for v in verdicts] == [(VerdictKind.STUCK_IN_PHASE, [0, 1, 2, 3])]
    assert " are all stuck in execute_model at step 3 " in verdicts[0].summary
    assert "one of them holds the others" in verdicts[0].summary
    states = verdicts[0].evidence["states"]
    assert states["2"].startswith("collective at ") and states["0"] == "not sampled: positions only"


@pytest.mark.parametrize("culprit_frames,culprit_activity", [
    (SLEEPING, Activity.SLEEPING), (["tests/plugin.py:20 spin"], Activity.RUNNING)])
def test_the_rank_not_waiting_while_its_peer_waits_in_the_collective_is_the_culprit(
        culprit_frames, culprit_activity):
    job, t = both_inside_step()
    sample(job, 0, culprit_activity, culprit_frames, t + 1.5)
    sample(job, 1, Activity.COLLECTIVE, IN_ALL_REDUCE, t + 1.5)
    verdicts = analyze(job.snapshot())
    assert summary(verdicts) == [(VerdictKind.STUCK_IN_PHASE, [0], [1])]
    assert "waiting" not in verdicts[0].evidence.get("states", {}).get("0", "")


def test_a_sample_taken_before_the_rank_last_moved_is_not_trusted():
    job, t = both_inside_step()
    sample(job, 0, Activity.SLEEPING, SLEEPING, t - 1.0)      # before step 3 began
    sample(job, 1, Activity.COLLECTIVE, IN_ALL_REDUCE, t + 1.5)
    assert [v.culprit_ranks for v in analyze(job.snapshot())] == [[0, 1]]


def test_the_rank_table_shows_only_the_samples_the_analysis_trusts():
    """Both samples are seconds old; rank 0's was taken before it last moved."""
    job, t = both_inside_step()
    sample(job, 0, Activity.SLEEPING, SLEEPING, t - 1.0)
    sample(job, 1, Activity.COLLECTIVE, IN_ALL_REDUCE, t + 1.5)
    snapshot = job.snapshot()
    doing = {row.rank: row.doing for row in rank_rows(snapshot, analyze(snapshot))}
    assert doing == {0: "", 1: "collective"}


def test_a_sample_that_took_long_to_read_is_shown_for_as_long_once_it_is_read():
    """On a starved host a dump takes 10 s and more: the sample's news counts from
    when it was read, or a compile would be shown for a moment, if at all."""
    from diagnose.offline.report import SAMPLE_SHOWN_S
    job, t = both_inside_step(stall_s=SAMPLE_SHOWN_S + 5.0)
    for rank, read_s in ((0, SAMPLE_SHOWN_S - 1.0), (1, 2.0)):
        sample(job, rank, Activity.COMPILING, COMPILING, t + 0.5, compiling_since=t + 0.5)
        job.ranks[rank].activity.done_at = t + 0.5 + read_s
    snapshot = job.snapshot()
    doing = {row.rank: row.doing for row in rank_rows(snapshot, analyze(snapshot))}
    assert doing == {0: f"compiling {SAMPLE_SHOWN_S + 4.5:.0f} s", 1: ""}


def test_two_ranks_both_waiting_in_the_collective_name_no_single_culprit():
    job, t = both_inside_step()
    for rank in (0, 1):
        sample(job, rank, Activity.COLLECTIVE, IN_ALL_REDUCE, t + 1.5)
    assert [v.culprit_ranks for v in analyze(job.snapshot())] == [[0, 1]]


def test_a_healthy_run_with_samples_has_no_verdict():
    job, t = vllm_tp2(steps=20, now_after=0.05)
    for rank in (0, 1):
        sample(job, rank, Activity.IDLE, IDLE, t - 0.5)
    assert analyze(job.snapshot()) == []


def test_a_caught_exception_is_the_culprit_not_the_peer_that_waits_for_it():
    job, t = vllm_tp2(steps=3, now_after=3.0)
    job.driver_step(3, t, None)
    compiled_step(job, 0, 3, t, None)                       # waits in the all-reduce
    caught_exception(job, t, 1, 3)
    verdicts = analyze(job.snapshot())
    assert summary(verdicts) == [(VerdictKind.RAISED, [1], [0])]
    verdict = verdicts[0]
    assert verdict.step == 3 and verdict.phase == Phase.EXECUTE_MODEL
    assert "raised RuntimeError: injected by the plugin in execute_model step 3" in verdict.summary
    assert "tests/vllm_plugin.py:40 execute_model" in verdict.summary
    assert verdict.evidence["error"]["frame"] == "tests/vllm_plugin.py:40 execute_model"
    assert "it went on and is now in dequeue" in verdict.summary


def test_a_caught_exception_is_the_culprit_also_when_its_rank_took_the_next_step():
    """A CI run of vLLM tp2 x pp2: rank 3 asserted in step 52 and, its exception
    caught, took the pipeline's next batch, step 53, where it sat in the
    all-reduce; rank 2 sat in step 52's. By positions rank 3 waits on rank 2
    (behind it), and rank 2 was named stuck with rank 3 among its victims."""
    job, t = vllm_tp2(steps=3, now_after=20.0)
    job.driver_step(3, t, None)
    compiled_step(job, 0, 3, t, None)                       # waits in the all-reduce
    caught_exception(job, t, 1, 3, went_on=True)
    verdicts = analyze(job.snapshot())
    assert summary(verdicts) == [(VerdictKind.RAISED, [1], [0])]
    assert "; it went on and is now in execute_model;" in verdicts[0].summary


def test_a_caught_exception_whose_peers_go_on_is_no_verdict():
    job, t = vllm_tp2(steps=3, now_after=0.05)
    caught_exception(job, t, 1, 3)
    assert analyze(job.snapshot()) == []


def test_an_exception_after_a_death_is_the_death_s_consequence():
    job, t = vllm_tp2(steps=3, now_after=3.0)
    job.driver_step(3, t, None)
    compiled_step(job, 0, 3, t, None)
    job.died(0, t + 0.5, -9)
    caught_exception(job, t + 0.6, 1, 3)                     # gloo: connection closed by peer
    verdicts = analyze(job.snapshot())
    assert [(v.kind, v.culprit_ranks) for v in verdicts] == [(VerdictKind.DEAD, [0])]


def test_a_rank_that_raised_and_died_is_named_with_its_exception():
    job, t = vllm_tp2(steps=3, now_after=2.0)
    job.driver_step(3, t, None)
    compiled_step(job, 0, 3, t, None)
    caught_exception(job, t, 1, 3)
    job.died(1, t + 0.1, 1)
    verdicts = analyze(job.snapshot())
    assert [(v.kind, v.culprit_ranks) for v in verdicts] == [(VerdictKind.RAISED, [1])]
    assert "it died" in verdicts[0].summary


def test_a_process_that_died_after_the_first_exception_is_its_consequence():
    """Our engine: rank 1 raises, the driver learns of it and exits at once, before
    any peer has waited long: one verdict, the exception, not the driver's death."""
    job, t = vllm_tp2(steps=3, now_after=1.0)
    job.driver_step(3, t, None)
    compiled_step(job, 0, 3, t, None)
    caught_exception(job, t, 1, 3)
    job.died(0, t + 0.3, -15)                                # ended by the driver's exit
    verdicts = analyze(job.snapshot())
    assert [(v.kind, v.culprit_ranks) for v in verdicts] == [(VerdictKind.RAISED, [1])]
    assert "then rank 0 died" in verdicts[0].summary and 0 in verdicts[0].victim_ranks


def test_a_peer_whose_last_heartbeat_came_before_the_exception_died_after_it():
    """Our engine in CI: rank 1 raises and its process ends; rank 0's all-reduce
    fails with "connection closed" and it exits 1. Rank 0's last heartbeat came
    before rank 1's exception, but its own failed step came after: it was alive
    then, so its death is the exception's consequence, not the cause."""
    job, t = vllm_tp2(steps=3, now_after=1.0)
    job.driver_step(3, t, None)
    caught_exception(job, t, 1, 3)
    job.died(1, t + 0.1, 1)
    compiled_step(job, 0, 3, t, None)
    state = job.ranks[0]
    state.open_phases[0].end = t + 0.3
    state.open_phases = []
    state.error = RaisedError(pid=state.identity.pid, at=t + 0.3, phase=Phase.EXECUTE_MODEL,
                              step=3, error="RuntimeError: Connection closed by peer",
                              frame="engine/communicator.py:100 all_reduce")
    job.died(0, t + 0.4, 1)
    state.heartbeat_at = t - 0.1
    verdicts = analyze(job.snapshot())
    assert [(v.kind, v.culprit_ranks) for v in verdicts] == [(VerdictKind.RAISED, [1])]
    assert "it died" in verdicts[0].summary


def test_a_rank_left_in_its_step_once_the_driver_ended_is_the_job_ending():
    """vLLM 0.11 stopped with SIGINT: its engine core's interpreter ends, rank 1
    ends when its parent is gone, and rank 0 is left in the step's all-gather for
    good while the API server still shuts down: no verdict (one did end a healthy
    minute on 0.11, benchmarks/vllm_matrix.py)."""
    job, t = vllm_tp2(steps=3, now_after=12.0)
    job.driver_step(3, t, None)
    for rank in (0, 1):
        compiled_step(job, rank, 3, t, None)
    end = t + 0.2
    for state, at in ((job.driver, end), (job.ranks[1], end + 0.1)):
        for event in state.open_phases:
            event.end = at
        state.open_phases = []
        job.phase(state, Phase.EXIT, at, at)
        state.alive, state.heartbeat_at = False, at
    assert analyze(job.snapshot()) == []


def test_an_error_in_dequeue_is_the_engine_ending_not_a_cause():
    job, t = vllm_tp2(steps=3, now_after=0.05)
    state = job.ranks[1]
    state.error = RaisedError(pid=state.identity.pid, at=t, phase=Phase.DEQUEUE, step=3,
                              error="RuntimeError: cancelled", frame=None)
    assert analyze(job.snapshot()) == []


def test_a_compiling_rank_is_progress_until_the_compile_limit():
    job, t = both_inside_step(stall_s=120.0)
    sample(job, 0, Activity.COMPILING, COMPILING, job.now - 1.0, compiling_since=t + 1.0)
    sample(job, 1, Activity.COLLECTIVE, IN_ALL_REDUCE, job.now - 1.0)
    assert analyze(job.snapshot()) == []
    verdicts = analyze(job.snapshot(), Thresholds(compile_s=60.0))
    assert summary(verdicts) == [(VerdictKind.COMPILE_TOO_LONG, [0], [1])]
    assert "compile limit" in verdicts[0].summary


@pytest.mark.parametrize("compiled_s_ago,hang", [(0.5, False), (None, True), (38.0, True)])
def test_the_wait_for_a_peers_compile_is_no_stall_even_between_two_compiles(compiled_s_ago, hang):
    """Rank 1 compiles function after function inside its step; its last sample
    fell between two compiles (its own code). Rank 0 spins in the step's all-reduce,
    an op of the compiled graph: busy, its own code by its stack. Its stall counts
    from rank 1's last compile, not from when it entered the step."""
    job, t = both_inside_step(stall_s=40.0)
    sample(job, 0, Activity.RUNNING, ["v1/worker/gpu_worker.py:300 execute_model",
                                      "torch/_ops.py:875 __call__"], job.now - 1.0)
    sample(job, 1, Activity.RUNNING, ["v1/worker/gpu_worker.py:300 execute_model",
                                      "<hs_test_faults 1.5>:2 new_function"], job.now - 1.0,
           compiled_at=None if compiled_s_ago is None else job.now - compiled_s_ago)
    assert bool(analyze(job.snapshot())) == hang


@pytest.mark.parametrize("paused_rank,hang", [(None, True), (0, False), (1, True)])
def test_the_time_diag_held_a_rank_stopped_for_its_native_dump_is_no_stall_of_its(
        paused_rank, hang):
    """py-spy --native stops the rank it reads, up to its 10 s timeout on a loaded
    host; the rank's TP peer waits in the step's all-reduce meanwhile. Only the
    held rank's own stall is excused: a dump of its peer excuses nothing of it."""
    job, t = both_inside_step(stall_s=8.0)
    sample(job, 0, Activity.SLEEPING, SLEEPING, t + 1.5)
    sample(job, 1, Activity.COLLECTIVE, IN_ALL_REDUCE, t + 1.5)
    snapshot = job.snapshot()
    snapshot.paused = [] if paused_rank is None else [Pause(paused_rank, t + 0.5, t + 7.5)]
    verdicts = analyze(snapshot)
    assert [v.culprit_ranks for v in verdicts] == ([[0]] if hang else [])


def test_a_tp_peer_held_by_a_dump_excuses_its_tied_peer_and_overlaps_count_once():
    """Both ranks inside the step, nothing pending, nothing sampled: a tie by
    positions. Rank 0 held for 5 s, then both at once for 1 s: 6 s excused of
    rank 1's 8 s stall too, against its 2 s limit."""
    job, t = both_inside_step(stall_s=8.0)
    snapshot = job.snapshot()
    snapshot.paused = [Pause(0, t + 0.5, t + 6.5), Pause(1, t + 5.5, t + 6.5)]
    assert analyze(snapshot) == []
    snapshot.paused = [Pause(0, t + 0.5, t + 2.5), Pause(1, t + 1.5, t + 2.5)]
    assert [v.culprit_ranks for v in analyze(snapshot)] == [[0, 1]]


def test_a_compile_does_not_hide_a_death():
    job, t = both_inside_step(stall_s=30.0)
    sample(job, 0, Activity.COMPILING, COMPILING, job.now - 1.0, compiling_since=t + 1.0)
    job.died(1, t + 2.0, -9)
    assert [v.kind for v in analyze(job.snapshot())] == [VerdictKind.DEAD]


def test_while_states_are_sampled_a_tie_waits_for_its_samples_then_falls_back():
    job, t = both_inside_step(stall_s=5.0)
    live = job.snapshot()
    live.sampling = True
    assert analyze(live) == []                     # 5 s: past the limit, not past the wait
    job.now = t + 13.0
    later = job.snapshot()
    later.sampling = True
    assert [v.culprit_ranks for v in analyze(later)] == [[0, 1]]
    states = analyze(later)[0].evidence["states"]
    assert set(states.values()) == {"not sampled: positions only"}


def test_where_ptrace_is_refused_a_tie_falls_back_to_positions_at_once_and_says_why():
    job, t = both_inside_step(stall_s=5.0)
    for rank in (0, 1):
        job.ranks[rank].activity = ActivitySample(
            activity=Activity.UNKNOWN, taken_at=t + 1.5, pid=job.ranks[rank].identity.pid,
            note="py-spy may not read pid 1000: Operation not permitted", denied=True)
    live = job.snapshot()
    live.sampling = True
    verdicts = analyze(live)
    assert [v.culprit_ranks for v in verdicts] == [[0, 1]]
    assert all(verdicts[0].evidence["states"][rank].startswith("unreadable (py-spy may not read")
               for rank in ("0", "1"))


def test_a_dump_that_failed_once_holds_a_tie_back_for_the_next_sample():
    """A CI run of our engine: rank 0 compiled inside its step and its one py-spy
    dump failed (not refused), rank 1 waited in the collective. The failed dump
    was taken for a sample to trust and the tie named both, on a healthy run."""
    for stall_s, named in ((5.0, []), (5.0 + SAMPLE_WAIT_S, [[0, 1]])):
        job, t = both_inside_step(stall_s=stall_s)
        job.ranks[0].activity = ActivitySample(
            activity=Activity.UNKNOWN, taken_at=t + 1.5, pid=job.ranks[0].identity.pid,
            note="py-spy dump of pid 1000 failed: Error: no python thread found")
        sample(job, 1, Activity.COLLECTIVE, IN_ALL_REDUCE, t + 1.5)
        live = job.snapshot()
        live.sampling = True
        assert [v.culprit_ranks for v in analyze(live)] == named, stall_s


def startup_tie() -> tuple[Job, float]:
    """tp=2, both in init_kv_cache (vLLM's profile run) for 30 s."""
    job = Job(tp=2, pp=1)
    for rank in (0, 1):
        job.startup(rank, 10.0, stop_in=Phase.INIT_KV_CACHE)
    job.now = 10.0 + 2 + 30.0
    return job, job.now


def test_a_start_up_rank_seen_computing_is_progress_and_its_waiting_peer_no_culprit():
    """vLLM's profile run under load: rank 0 in a long GEMM, rank 1 in the
    all-reduce after it. Positions alone called both stuck after 20 s."""
    job, now = startup_tie()
    assert [v.culprit_ranks for v in analyze(job.snapshot())] == [[0, 1]]
    sample(job, 0, Activity.RUNNING, ["worker.py:1 profile_run", "[native] libtorch_cpu.so gemm"],
           now - 1.0)
    job.ranks[0].activity.busy = True
    sample(job, 1, Activity.COLLECTIVE, IN_ALL_REDUCE, now - 1.0)
    assert analyze(job.snapshot()) == []


def test_a_start_up_rank_seen_blocked_outside_a_collective_is_the_culprit_alone():
    job, now = startup_tie()
    sample(job, 0, Activity.SLEEPING, SLEEPING, now - 1.0)
    sample(job, 1, Activity.COLLECTIVE, IN_ALL_REDUCE, now - 1.0)
    assert summary(analyze(job.snapshot())) == [(VerdictKind.STUCK_IN_PHASE, [0], [1])]


def test_a_job_that_ended_after_a_rank_raised_crashed_and_names_its_first_failure():
    from diagnose.analysis.crash import crash_of
    from diagnose.offline.report import renderable, to_json
    from rich.console import Console
    job, t = vllm_tp2(steps=3, now_after=2.0)
    caught_exception(job, t, 1, 3)
    later = job.ranks[0]
    later.error = RaisedError(pid=later.identity.pid, at=t + 1.0, phase=Phase.DEQUEUE, step=4,
                              error="RuntimeError: cancelled", frame=None)
    assert crash_of(job.snapshot()) is None               # still running: no crash yet
    job.command_exit = 0                                  # vLLM's server exits 0 after it
    crash = crash_of(job.snapshot())
    assert crash.rank == 1 and crash.at == t + 0.05
    assert "raised RuntimeError: injected by the plugin in execute_model step 3" in crash.summary
    assert to_json(job.snapshot(), [], crash=crash)["crashed"]["rank"] == 1
    console = Console(width=200, record=True)
    console.print(renderable(job.snapshot(), [], crash=crash))
    assert "[crashed] the job ended after a rank failed" in console.export_text()


def test_a_shutdown_error_alone_is_no_crash():
    from diagnose.analysis.crash import crash_of
    job, t = vllm_tp2(steps=3, now_after=2.0)
    state = job.ranks[1]
    state.error = RaisedError(pid=state.identity.pid, at=t, phase=Phase.DEQUEUE, step=3,
                              error="RuntimeError: cancelled", frame=None)
    job.command_exit = 0
    assert crash_of(job.snapshot()) is None


def test_diag_launch_exits_crashed_for_a_job_that_ended_after_a_raise_and_1_for_a_hang():
    from diagnose.cli.common import EXIT_CRASHED, EXIT_HEALTHY, EXIT_VERDICTS
    from diagnose.core.snapshot import Verdict
    from diagnose.launch.ending import judged_exit
    raised = Verdict(kind=VerdictKind.RAISED, culprit_ranks=[1], victim_ranks=[0], summary="")
    assert judged_exit([], 0, crashed=True) == EXIT_CRASHED       # vLLM exited 0 after it
    assert judged_exit([], 0) == EXIT_HEALTHY
    assert judged_exit([raised], 0) == EXIT_CRASHED               # the job ended by itself
    assert judged_exit([raised], None) == EXIT_VERDICTS           # diag ended a hung job


def test_a_rank_seen_waiting_at_the_rendezvous_for_a_rank_not_up_yet_is_no_culprit():
    """vLLM under load: rank 0's process is slow to start (no probe file yet), rank 1
    waits for it in init_distributed's rendezvous (gloo's PrefixStore::wait)."""
    job = Job(tp=2, pp=1)
    job.startup(1, 10.0, stop_in=Phase.INIT_DISTRIBUTED)
    del job.ranks[0]
    job.now = 10.0 + 25.0
    assert analyze(job.snapshot()) == []          # positions alone: it waits on rank 0
    sample(job, 1, Activity.COLLECTIVE, ["distributed_c10d.py:2169 _new_process_group_helper",
                                         "[native] libtorch_cpu.so gloo::rendezvous::"
                                         "PrefixStore::wait"], job.now - 1.0)
    assert analyze(job.snapshot()) == []


RENDEZVOUS_PYTHON_ONLY = ["v1/worker/gpu_worker.py:1664 init_worker_distributed_environment",
                          "distributed/distributed_c10d.py:2169 _new_process_group_helper"]


def rendezvous_without_rank_0() -> Job:
    """rank 1 in init_distributed for 25 s; rank 0's probe is not up yet."""
    job = Job(tp=2, pp=1)
    job.startup(1, 10.0, stop_in=Phase.INIT_DISTRIBUTED)
    del job.ranks[0]
    job.now = 10.0 + 25.0
    return job


@pytest.mark.parametrize("found,busy", [
    (Activity.RUNNING, False),      # a Python-only dump: gloo's C++ wait reads as running
    (Activity.UNKNOWN, False),      # py-spy failed
    (Activity.IDLE, False)])
def test_a_rank_at_the_rendezvous_not_seen_at_work_of_its_own_waits_on_the_absent_rank(
        found, busy):
    """vllm24's start-up case where the sample does not say `collective`: e77d2f4
    only spared a rank sampled waiting, so these named rank 1, the victim."""
    job = rendezvous_without_rank_0()
    sample(job, 1, found, RENDEZVOUS_PYTHON_ONLY, job.now - 1.0)
    job.ranks[1].activity.busy = busy
    snapshot = job.snapshot()
    snapshot.sampling = True
    assert analyze(snapshot) == []


def test_a_sample_from_before_the_rank_moved_does_not_name_it_at_the_rendezvous():
    job = rendezvous_without_rank_0()
    sample(job, 1, Activity.SLEEPING, SLEEPING, 10.0 - 5.0)      # older than its progress
    assert analyze(job.snapshot()) == []


@pytest.mark.parametrize("found,busy", [(Activity.SLEEPING, False), (Activity.RUNNING, True)])
def test_a_rank_seen_at_work_of_its_own_at_start_up_is_named_though_a_peer_is_absent(
        found, busy):
    """Asleep (or spinning) before its rendezvous: it holds the job up itself."""
    job = rendezvous_without_rank_0()
    sample(job, 1, found, SLEEPING if found == Activity.SLEEPING else ["x.py:1 spin"],
           job.now - 1.0)
    job.ranks[1].activity.busy = busy
    verdicts = analyze(job.snapshot())
    if busy:          # a busy start-up rank is progress (2515d0c): no verdict yet either
        assert verdicts == []
    else:
        assert summary(verdicts) == [(VerdictKind.STUCK_IN_PHASE, [1], [])]


def failed_busy_sample(job: Job, rank: int, at: float) -> None:
    """py-spy could not read the rank (vllm24: "py-spy dump of pid N failed: 10:
    main" on a rank compiling in a loop), yet it used CPU since the last sample."""
    job.ranks[rank].activity = ActivitySample(
        activity=Activity.UNKNOWN, taken_at=at, pid=job.ranks[rank].identity.pid,
        note="py-spy dump of pid 1001 failed: 10: main", busy=True)


@pytest.mark.parametrize("peer", ["collective", "python-only", "failed", "unsampled"])
def test_a_busy_rank_whose_sample_failed_is_no_second_culprit(peer):
    """vllm24's tp=2 pp=2 run: rank 1 compiled inside its step, py-spy failed on it,
    positions decided and named [0] and [1], two verdicts for one cause."""
    job, t = both_inside_step(stall_s=30.0)
    failed_busy_sample(job, 1, job.now - 1.0)
    if peer == "collective":
        sample(job, 0, Activity.COLLECTIVE, IN_ALL_REDUCE, job.now - 1.0)
    elif peer == "python-only":
        sample(job, 0, Activity.RUNNING, IN_ALL_REDUCE[:2] + ["torch/_ops.py:800 __call__"],
               job.now - 1.0)
    elif peer == "failed":
        job.ranks[0].activity = ActivitySample(
            activity=Activity.UNKNOWN, taken_at=job.now - 1.0, pid=job.ranks[0].identity.pid,
            note="py-spy dump of pid 1000 failed: 10: main")
    live = job.snapshot()
    live.sampling = True
    verdicts = analyze(live)
    assert verdicts == []                  # it used CPU a second ago: progress
    job.now += 60.0                        # no sample since: its stall counts again
    later = job.snapshot()
    later.sampling = True
    assert [v.culprit_ranks for v in analyze(later)] == [[1]]


def test_a_busy_rank_whose_sample_failed_waits_for_its_next_sample_before_it_is_named():
    """diag launch samples a busy rank again 2 s on, and a failed dump may take
    10 s: a stall a few seconds past the floor is the gap between samples."""
    job, t = both_inside_step(stall_s=30.0)
    failed_busy_sample(job, 1, job.now - 6.0)
    sample(job, 0, Activity.COLLECTIVE, IN_ALL_REDUCE, job.now - 1.0)
    live = job.snapshot()
    live.sampling = True
    assert analyze(live) == []
    job.now += 20.0
    later = job.snapshot()
    later.sampling = True
    [verdict] = analyze(later)
    assert summary([verdict]) == [(VerdictKind.STUCK_IN_PHASE, [1], [0])]
    assert verdict.evidence["states"]["1"].startswith("busy, its stack unreadable (py-spy")


def test_a_sample_that_fails_for_an_unforeseen_reason_says_why_once_and_sampling_goes_on(
        tmp_path, monkeypatch):
    """py-spy's known failures are notes of the sample; this forces one nobody
    foresaw (a double of `sample`), which must reach the report, not the pool."""
    import dataclasses
    import socket
    from diagnose.launch.states import RESAMPLE_S, StateSampler
    job, _ = both_inside_step()
    snapshot = job.snapshot()
    for state in snapshot.ranks.values():
        state.identity = dataclasses.replace(state.identity, host=socket.gethostname())
    sampler = StateSampler(str(tmp_path))
    calls = []

    def unforeseen(rank, pid):
        calls.append(rank)
        raise KeyError("threads")

    monkeypatch.setattr(sampler, "sample", unforeseen)
    try:
        for later in (0.0, RESAMPLE_S + 0.1):
            sampler.update(dataclasses.replace(snapshot, taken_at=snapshot.taken_at + later))
            sampler.quiet(5.0)
    finally:
        sampler.close()
    assert sorted(calls) == [0, 0, 1, 1]          # sampled again after each failure
    assert sorted(sampler.notes) == [f"the state sample of rank {rank} failed: KeyError: 'threads'"
                                     for rank in (0, 1)]
    assert not sampler.dumping()
