"""A rank that waited for a CPU while it stalled (a starved host) is given that
time on top of its stall limit, at most Thresholds.cpu_stretch times the limit:
the formula, its bound, the evidence, and the collector's /proc readers."""
import os
import time
from dataclasses import asdict

import pytest

from diagnose.analysis import analyze
from diagnose.analysis.starved import cpu_waited
from diagnose.analysis.thresholds import StallLimits, Thresholds
from diagnose.core.snapshot import CpuWait, HostLoad, ranks_from_dicts
from diagnose.core.vocab import VerdictKind
from diagnose.launch.cpuload import HostMeter, RunDelays
from diagnose.launch.collector import Collector
from diagnose.offline.synth import hung_job, write_run_dir
from helpers.synthetic import Job

pytestmark = pytest.mark.unit

NOW = 5000.0
CULPRIT = 4


def _limits(**kwargs) -> StallLimits:
    return StallLimits(Job().snapshot(), Thresholds(**kwargs))


def test_the_limit_grows_by_the_time_waited_for_a_cpu():
    limits = _limits()
    assert limits.stretched(2.0, 0.0) == 2.0
    assert limits.stretched(2.0, 5.5) == 7.5


def test_the_stretch_is_bounded_by_cpu_stretch_times_the_limit():
    assert _limits().stretched(2.0, 1000.0) == 20.0
    assert _limits(cpu_stretch=3.0).stretched(2.0, 1000.0) == 6.0
    assert _limits(cpu_stretch=1.0).stretched(2.0, 1000.0) == 2.0


def _starved(state, since: float, until: float, share: float) -> None:
    """Run-delay samples a second apart: `share` of each second spent waiting."""
    state.cpu_waits = [CpuWait(at=since + i, waited_s=100.0 + share * i)
                       for i in range(int(until - since) + 1)]


def test_the_wait_is_read_over_exactly_the_stall():
    state = Job().ranks[0]
    _starved(state, 100.0, 110.0, share=0.5)
    assert cpu_waited(state, 102.0, 106.0) == pytest.approx(2.0)
    assert cpu_waited(state, 102.5, 103.25) == pytest.approx(0.375)   # between samples
    assert cpu_waited(state, 90.0, 101.0) == pytest.approx(0.5)       # before the first: nothing
    assert cpu_waited(state, 109.0, 130.0) == pytest.approx(0.5)      # after the last: nothing
    state.cpu_waits = state.cpu_waits[:1]
    assert cpu_waited(state, 100.0, 110.0) == 0.0


def _hang(hang_s: float, share: float | None, host: HostLoad | None = None):
    job = hung_job(8, 2, CULPRIT, VerdictKind.STUCK_IN_PHASE, now=NOW, hang_s=hang_s)
    if share is not None:
        _starved(job.ranks[CULPRIT], NOW - hang_s - 2.0, NOW, share)
    snapshot = job.snapshot()
    snapshot.host = host
    return snapshot


def test_a_rank_that_stalls_while_it_waits_for_a_cpu_is_no_hang():
    """Stuck 8 s in forward (limit 2 s), 7.2 s of them waiting for a core."""
    snapshot = _hang(8.0, share=0.9)
    assert analyze(snapshot) == []
    verdicts = analyze(snapshot, Thresholds(cpu_stretch=1.0))     # the limits of before
    assert [(v.kind, v.culprit_ranks) for v in verdicts] == [
        (VerdictKind.STUCK_IN_PHASE, [CULPRIT])]
    assert verdicts[0].evidence["cpu_wait"][str(CULPRIT)]["stretched_limit_s"] == 2.0


def test_a_hang_on_a_starved_host_is_still_named_past_the_bound():
    """25 s stuck, 22.5 s of it waiting: the limit stops at 10 x 2 s, and the
    evidence says what the rank was judged by and under which host load."""
    host = HostLoad(load_per_cpu=24.5, cpu_pressure=1.0)
    [verdict] = analyze(_hang(25.0, share=0.9, host=host))
    assert (verdict.kind, verdict.culprit_ranks) == (VerdictKind.STUCK_IN_PHASE, [CULPRIT])
    assert verdict.evidence["cpu_wait"] == {str(CULPRIT): {
        "cpu_waited_s": pytest.approx(22.5, abs=0.3), "limit_s": 2.0, "stretched_limit_s": 20.0}}
    assert verdict.evidence["host"] == {"load_per_cpu": 24.5, "cpu_pressure": 1.0}


def test_a_stall_while_another_process_of_the_job_waited_for_a_cpu_is_no_hang():
    """Rank 4 sits blocked in a collective whose data a starved peer's transport
    thread has not written yet: the wait is the peer's, as the real engine
    showed under load (the stalled rank itself waited 0.1 s of 2.9)."""
    snapshot = _hang(8.0, share=None)
    _starved(snapshot.ranks[5], NOW - 10.0, NOW, share=0.9)
    assert analyze(snapshot) == []


def test_the_waits_of_the_job_add_up():
    """Two peers, each waiting 3.6 s of the 8 s: one alone would leave the
    limit at 5.6 s; one after another they explain the whole stall."""
    snapshot = _hang(8.0, share=None)
    for rank in (5, 6):
        _starved(snapshot.ranks[rank], NOW - 8.0, NOW, share=0.45)
    assert analyze(snapshot) == []
    snapshot.ranks[6].cpu_waits = []
    [verdict] = analyze(snapshot)
    assert verdict.evidence["cpu_wait"][str(CULPRIT)]["stretched_limit_s"] == pytest.approx(
        5.6, abs=0.1)


def test_a_blocked_hang_that_waits_for_no_cpu_is_named_on_time():
    [verdict] = analyze(_hang(3.0, share=0.0))
    assert verdict.culprit_ranks == [CULPRIT] and "cpu_wait" not in verdict.evidence


def _cycle(share_of: dict[int, float]):
    """Ranks 0 and 1 inside one all_reduce of tp0 for 6 s: a cycle."""
    job = Job(tp=2, pp=1)
    t = job.healthy(5, job.everyone_started())
    job.driver_step(5, t, None)
    for rank in (0, 1):
        job.dequeue(rank, t, t + 0.01)
        job.ranks[rank].ring_read += 1
        job.step(rank, 5, t + 0.01, stop="forward")
    job.now = t + 6.0
    for rank, share in share_of.items():
        _starved(job.ranks[rank], t - 1.0, job.now, share)
    return job.snapshot()


def test_a_cycle_waits_while_the_job_waited_for_a_cpu():
    assert [v.kind for v in analyze(_cycle({}))] == [VerdictKind.STUCK_IN_PHASE]
    assert analyze(_cycle({1: 0.8})) == []
    [verdict] = analyze(_cycle({1: 0.8}), Thresholds(cpu_stretch=1.5))
    assert verdict.culprit_ranks == [0, 1] and list(verdict.evidence["cpu_wait"]) == ["0", "1"]


def _fake_task(proc, pid: int, tid: int, text: str) -> None:
    os.makedirs(proc / str(pid) / "task" / str(tid), exist_ok=True)
    (proc / str(pid) / "task" / str(tid) / "schedstat").write_text(text)


def test_run_delays_sum_the_threads_and_keep_a_sample_a_second(tmp_path, monkeypatch):
    _fake_task(tmp_path, 42, 42, "5000 1500000000 7\n")
    _fake_task(tmp_path, 42, 43, "5000 500000000 2\n")
    _fake_task(tmp_path, 42, 44, "garbage\n")            # a thread that is ending
    clock = [1000.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    delays = RunDelays(proc=str(tmp_path))
    assert delays.history(42, 1.0) == [CpuWait(at=1000.0, waited_s=2.0)]
    _fake_task(tmp_path, 42, 42, "5000 4500000000 9\n")
    clock[0] = 1000.5                                      # the latest read, not kept
    assert delays.history(42, 1.0) == [CpuWait(1000.0, 2.0), CpuWait(1000.5, 5.0)]
    clock[0] = 1001.0
    assert delays.history(42, 1.0) == [CpuWait(1000.0, 2.0), CpuWait(1001.0, 5.0)]
    clock[0] = 1001.2
    assert delays.history(42, 1.0)[-2:] == [CpuWait(1001.0, 5.0), CpuWait(1001.2, 5.0)]
    assert delays.history(7, 1.0) == []                    # no such process
    delays.forget_others({(7, 1.0)})
    clock[0] = 1200.0
    assert delays.history(42, 1.0) == [CpuWait(at=1200.0, waited_s=5.0)]


def test_run_delays_of_a_real_process():
    [sample] = RunDelays().history(os.getpid(), 0.0)
    assert sample.waited_s >= 0.0 and abs(sample.at - time.time()) < 5.0


def test_host_pressure_is_measured_from_psi_totals(tmp_path, monkeypatch):
    psi = tmp_path / "cpu"
    psi.write_text("some avg10=40.00 avg60=1.00 avg300=0.50 total=1000000\n"
                   "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    clock = [50.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    meter = HostMeter(psi_file=str(psi))
    assert meter.read().cpu_pressure == 0.4              # the kernel's avg10 on the first read
    psi.write_text("some avg10=40.00 avg60=1.00 avg300=0.50 total=4000000\n")
    clock[0] = 54.0
    assert meter.read().cpu_pressure == 0.75             # 3 s of waiting over 4 s
    clock[0] = 70.0
    assert meter.read().cpu_pressure == 0.0              # no waiting since the last read


def test_host_without_psi_gives_the_load_alone(tmp_path):
    load = HostMeter(psi_file=str(tmp_path / "absent")).read()
    assert load.cpu_pressure is None and load.load_per_cpu >= 0.0
    (tmp_path / "odd").write_text("nothing here\n")
    assert HostMeter(psi_file=str(tmp_path / "odd")).read().cpu_pressure is None


def test_a_node_report_carries_its_ranks_waits():
    """Across nodes each rank is judged by the wait its own host's collector saw:
    the samples travel in the RankState of the node's report."""
    state = Job().ranks[0]
    _starved(state, 10.0, 13.0, share=0.5)
    [(rank, back)] = ranks_from_dicts({"0": asdict(state)}).items()
    assert rank == 0 and back.cpu_waits == state.cpu_waits
    with pytest.raises(ValueError):
        ranks_from_dicts({"0": asdict(state) | {"cpu_waits": [{"at": "soon", "waited_s": 1.0}]}})


def test_the_collector_reads_a_process_once_a_snapshot(tmp_path):
    """A synthetic run dir's ranks are all this process: one read, one history."""
    run = write_run_dir(hung_job(8, 2, CULPRIT, VerdictKind.STUCK_IN_PHASE).snapshot(),
                        str(tmp_path / "run"))
    collector = Collector(run.run_dir)
    for _ in range(2):
        snapshot = collector.snapshot()
    histories = {id(state.cpu_waits) for state in [*snapshot.ranks.values(), snapshot.driver]}
    assert len(histories) == 1 and 1 <= len(snapshot.ranks[0].cpu_waits) <= 2
    assert snapshot.host is not None and snapshot.host.load_per_cpu >= 0.0
