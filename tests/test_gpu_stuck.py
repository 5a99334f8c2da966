"""gpu_stuck on hand-built snapshots of a tp=2 job on GPUs: the host enqueues its
all-reduces and moves on to sampling, while the device of one rank never
reaches them (a kernel before them spins) and the other's waits inside them."""
from dataclasses import replace

from diagnose.analysis import analyze, rewind
from synthetic import OP_S, Job


def on_device(job, done_before):
    """Every record so far traced on the GPU, reached and finished when the host returned."""
    for state in job.ranks.values():
        state.collectives = [replace(record, device=True, t_device_start=record.t_enqueue,
                                     t_device_done=record.t_complete)
                             if record.t_complete is not None and record.t_complete <= done_before
                             else record for record in state.collectives]


def gpu_hang(now, rank_0_device_started=True):
    """Steps 0-1 healthy; in step 2 both hosts return from both all-reduces and
    block in sample (waiting on the GPU); rank 1's GPU spins before the first."""
    job = Job(tp=2, pp=1, now=now)
    t = job.healthy(2, job.everyone_started())
    on_device(job, t)
    job.driver_step(2, t, None)
    for rank, state in job.ranks.items():
        job.dequeue(rank, t, t + OP_S)
        state.ring_read += 1
        job.phase(state, "execute_model", t + OP_S, None, 2)
        job.phase(state, "forward", t + OP_S, t + 4 * OP_S, 2)
        for index in range(2):
            record = job.record(rank, "tp0", "all_reduce", t + (2 + index) * OP_S,
                                t + (2 + index) * OP_S + 0.001)
            record.device = True
        job.phase(state, "sample", t + 4 * OP_S, None, 2)
        state.frame = "engine/sampler.py:40 sample"
    first = job.ranks[0].collectives[-2]
    if rank_0_device_started:
        first.t_device_start = t + 2 * OP_S + 0.05
    job.fault(1, "rank=1,at=forward,step=2,kind=gpu_spin", t + OP_S)
    return job, t


def test_a_gpu_that_never_reaches_the_all_reduce_is_gpu_stuck_while_its_peer_waits_inside():
    job, t = gpu_hang(now=0.0)
    job.now = t + 6.0
    verdicts = analyze(job.snapshot())
    assert [verdict.kind for verdict in verdicts] == ["gpu_stuck"], [v.summary for v in verdicts]
    verdict = verdicts[0]
    assert verdict.culprit_ranks == [1] and verdict.victim_ranks == [0]
    assert (verdict.group, verdict.seq) == ("tp0", 4)
    assert 5.9 < verdict.detected_after_s < 6.1
    assert "the GPU has not reached tp0 all_reduce seq 4" in verdict.summary
    assert "the host is in sample" in verdict.summary
    assert "engine/sampler.py:40 sample" in verdict.summary
    device = verdict.evidence["device"]
    assert device["not_reached"]["seq"] == 4 and device["last_finished"]["seq"] == 3
    assert verdict.evidence["victims_on_device"] == {"0": "tp0 all_reduce seq 4"}


def test_gpu_stuck_waits_for_the_stall_limit():
    job, t = gpu_hang(now=0.0)
    job.now = t + 1.0
    assert analyze(job.snapshot()) == []


def test_a_peer_whose_gpu_has_not_reached_the_call_either_is_still_not_the_culprit_alone():
    """Both GPUs short of the call: each waits on its own GPU, so both are named."""
    job, t = gpu_hang(now=0.0, rank_0_device_started=False)
    job.now = t + 6.0
    verdicts = analyze(job.snapshot())
    assert sorted(verdict.culprit_ranks[0] for verdict in verdicts
                  if verdict.kind == "gpu_stuck") == [0, 1]


def test_device_times_after_the_rewind_point_are_forgotten():
    job, t = gpu_hang(now=0.0)
    job.now = t + 6.0
    record = job.ranks[0].collectives[-2]
    rewound = rewind(job.snapshot(), record.t_device_start - 0.01)
    assert rewound.ranks[0].collectives[-2].t_device_start is None
    assert rewound.ranks[0].collectives[-3].t_device_done is not None


def test_records_not_traced_on_the_gpu_keep_the_host_only_analysis():
    """A CPU job with the same host picture (calls returned, ranks in sample) has
    no device records: nobody waits in a collective, so no gpu_stuck."""
    job, t = gpu_hang(now=0.0)
    for state in job.ranks.values():
        state.collectives = [replace(record, device=False, t_device_start=None,
                                     t_device_done=None) for record in state.collectives]
    job.now = t + 6.0
    assert "gpu_stuck" not in [verdict.kind for verdict in analyze(job.snapshot())]


def test_a_rank_whose_host_went_back_to_dequeue_is_still_gpu_stuck():
    """Only the output rank syncs in sample: rank 1's host finishes the step and
    waits for the next broadcast, while its GPU never reached the all-reduce."""
    job, t = gpu_hang(now=0.0)
    state = job.ranks[1]
    for event in list(state.open_phases):
        event.end = t + 5 * OP_S
        state.open_phases.remove(event)
    job.dequeue(1, t + 6 * OP_S)
    job.now = t + 6.0
    verdicts = analyze(job.snapshot())
    assert [(v.kind, v.culprit_ranks) for v in verdicts] == [("gpu_stuck", [1])]
    assert "the host is in dequeue" in verdicts[0].summary
