"""Where the ranks parted: each member's calls counted per call site, up to the
call where a skipped one surfaced."""
from diagnose.analysis import analyze
from diagnose.analysis.thresholds import Thresholds
from diagnose.core.snapshot import Identity
from helpers.synthetic import Job

TRAIN, END = "train.py:10 step", "train.py:20 main"


def generic_job(ranks: int) -> Job:
    job = Job(tp=1, pp=ranks)
    for rank, state in job.ranks.items():
        state.identity = Identity(role="process", rank=rank, world_size=ranks, tp_rank=None,
                                  tp_size=None, pp_rank=None, pp_size=None, host="host",
                                  pid=1000 + rank, device="cpu",
                                  groups={"world": list(range(ranks))})
    return job


def call(job, rank, op, site, t, done=True):
    record = job.record(rank, "world", op, t, t + 0.01 if done else None)
    record.site = site


def test_a_call_skipped_long_before_a_mismatch_shows_in_the_counts_per_site():
    job = generic_job(4)
    for rank in job.ranks:
        steps = [step for step in range(40) if not (rank == 2 and step == 10)]
        for step in steps:
            call(job, rank, "all_reduce", TRAIN, 990.0 + step * 0.1)
        if rank == 2:
            call(job, rank, "barrier", END, 994.0, done=False)
    for rank in (0, 1, 3):
        job.ranks[rank].collectives[-1].t_complete = None
        job.ranks[rank].collectives[-1].state = "enqueued"
    [verdict] = analyze(job.snapshot(), Thresholds(stall_s=1.0))
    assert (verdict.kind, verdict.culprit_ranks, verdict.seq) == ("collective_mismatch", [2], 39)
    assert verdict.summary.endswith(
        "; rank 2 made 39 all_reduce calls at train.py:10 step where ranks 0-1 and 3 made 40")
    assert verdict.evidence["calls_per_site"]["since_seq"] == 0


def test_counts_start_where_every_member_still_holds_its_calls():
    """The ring of rank 0 dropped its first calls: every rank is counted from the
    first seq all of them hold."""
    job = generic_job(2)
    for rank in job.ranks:
        for step in range(12):
            if not (rank == 1 and step == 7):
                call(job, rank, "all_reduce", TRAIN, 990.0 + step * 0.1)
        if rank == 1:
            call(job, rank, "barrier", END, 992.0, done=False)
    job.ranks[0].collectives[-1].t_complete = None
    job.ranks[0].collectives[-1].state = "enqueued"
    del job.ranks[0].collectives[:4]
    [verdict] = analyze(job.snapshot(), Thresholds(stall_s=1.0))
    assert verdict.culprit_ranks == [1]
    assert verdict.summary.endswith(
        "rank 1 made 7 all_reduce calls at train.py:10 step since seq 4 where rank 0 made 8")
