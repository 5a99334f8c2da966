"""One root cause, one culprit: what follows from a cause that an earlier rule
named is shown as its consequence, never blamed on a second rank."""
import os
import pickle
import shutil

import pytest

from diagnose.analysis import analyze
from diagnose.analysis.causes import CONSEQUENCES, fold_consequences
from diagnose.analysis.thresholds import Thresholds
from diagnose.core.snapshot import Verdict
from diagnose.launch.collector import Collector
from diagnose.offline.flight_recorder import read_fr_dir
from helpers.synthetic import Job
from helpers.fr_dumps import nccl_dump, nccl_entry

POST_MORTEM = Thresholds(stall_s=0.0)
WORLD = ("0", "default_pg")


def write_dumps(directory, calls_by_rank, pending_from):
    """One NCCL dump per rank: world all_reduces of the given first dims,
    completed before index `pending_from[rank]` and scheduled from there on."""
    for rank, dims in calls_by_rank.items():
        entries = []
        for index, dim in enumerate(dims):
            state = "completed" if index < pending_from[rank] else "scheduled"
            entry = nccl_entry(index, WORLD, index + 1, "nccl:all_reduce", state)
            entry["input_sizes"] = entry["output_sizes"] = [[dim, 64]]
            entries.append(entry)
        dump = nccl_dump(entries, {"0": ("default_pg", sorted(calls_by_rank))})
        (directory / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump))
    return read_fr_dir(str(directory)).snapshot


def culprits(verdicts):
    return [(str(verdict.kind), verdict.culprit_ranks) for verdict in verdicts]


def test_a_size_mismatch_names_the_rank_with_the_other_size_and_nothing_else(tmp_path):
    """Rank 1 made its fourth all_reduce with 8 rows: rank 0 finished it and
    stopped, rank 1 went on and waits in the fifth, which rank 0 never made."""
    snapshot = write_dumps(tmp_path, {0: [4, 4, 4, 4], 1: [4, 4, 4, 8, 4]}, {0: 4, 1: 4})
    [verdict] = analyze(snapshot, POST_MORTEM)
    assert (verdict.kind, verdict.culprit_ranks, verdict.victim_ranks) == (
        "collective_mismatch", [1], [0])
    assert "rank 1 made it with other sizes or dtypes" in verdict.summary


def test_a_tie_of_two_ranks_goes_to_the_call_the_group_made_before(tmp_path):
    """Only one call agreed before the mismatch: too short for a rhythm, but the
    group made rank 0's call before and never rank 1's."""
    snapshot = write_dumps(tmp_path, {0: [4, 4, 4], 1: [4, 8, 4]}, {0: 2, 1: 2})
    assert culprits(analyze(snapshot, POST_MORTEM)) == [("collective_mismatch", [1])]


def test_a_mismatch_whose_peer_went_back_to_the_driver_is_one_verdict():
    """tp=2: rank 1's all_reduce of step 3 has other rows; rank 0 finished the
    step and waits for the next one, the driver waits on rank 0's output, and
    rank 1 waits in an all_reduce rank 0 never makes. The cycle of rank 0 and
    the driver follows from the mismatch."""
    job = Job(tp=2, pp=1)
    t = job.healthy(3, job.everyone_started())
    job.driver_step(3, t, None)
    job.dequeue(0, job.step(0, 3, t + 0.01))
    job.step(1, 3, t + 0.01, stop="forward_entry")
    job.phase(job.ranks[1], "forward", t + 0.03, None, 3)
    job.record(1, "tp0", "all_reduce", t + 0.03, t + 0.04, shape=[8, 64])
    job.record(1, "tp0", "all_reduce", t + 0.05, None)
    job.now = t + 5.0
    [verdict] = analyze(job.snapshot())
    assert (verdict.kind, verdict.culprit_ranks, verdict.victim_ranks) == (
        "collective_mismatch", [1], [0])
    assert verdict.evidence[CONSEQUENCES] == [
        "rank 0 and the driver wait on each other in dequeue for 5 s"]


def verdict(kind, culprits, victims, summary="") -> Verdict:
    return Verdict(kind=kind, culprit_ranks=culprits, victim_ranks=victims,
                   summary=summary or f"{kind} {culprits}")


def test_a_rank_stuck_waiting_on_a_dead_one_is_a_consequence_of_the_death():
    dead = verdict("dead", [2], [3, 4])
    stuck = verdict("stuck_in_phase", [4], [6, 7])
    assert fold_consequences([dead, stuck]) == [dead]
    assert dead.victim_ranks == [3, 4, 6, 7]
    assert dead.evidence[CONSEQUENCES] == ["stuck_in_phase [4]"]


def test_a_cycle_through_a_rank_that_skipped_a_collective_is_not_a_second_cause():
    skipped = verdict("collective_missing_peers", [5], [4, 6, 7])
    cycle = verdict("stuck_in_phase", [4, 5], [7])
    again = verdict("stuck_in_phase", [5], [])
    assert fold_consequences([skipped, cycle, again]) == [skipped]
    assert skipped.victim_ranks == [4, 6, 7]
    assert len(skipped.evidence[CONSEQUENCES]) == 2


def test_causes_that_explain_none_of_each_other_stay_apart():
    """Two GPUs that each stopped, with nobody waiting on either: two causes."""
    first, second = verdict("gpu_stuck", [0], []), verdict("gpu_stuck", [1], [])
    assert fold_consequences([first, second]) == [first, second]
    assert CONSEQUENCES not in first.evidence


RUNS = os.path.join(os.path.dirname(__file__), "fixtures", "runs")


@pytest.mark.parametrize("damage", [
    lambda raw: raw[:100],                                  # truncated
    lambda raw: bytes(byte ^ 0x5A for byte in raw),          # garbage
])
def test_a_rank_whose_file_cannot_be_read_is_named_never_the_ranks_that_wait_on_it(
        tmp_path, damage):
    """The recorded run where rank 6 never reached execute_model, with rank 6's
    file damaged: its peers still wait on it, and the verdict says its state is
    unknown. (It named ranks 4 and 7, which wait on it.)"""
    run = tmp_path / "run"
    shutil.copytree(os.path.join(RUNS, "rank6_never_reached"), run)
    probe = run / "rank-6.probe"
    probe.write_bytes(damage(probe.read_bytes()))
    snapshot = Collector(str(run)).snapshot()
    assert 6 not in snapshot.ranks and 6 in snapshot.unreadable
    [verdict] = analyze(snapshot)
    assert (verdict.kind, verdict.culprit_ranks, verdict.victim_ranks) == (
        "state_unreadable", [6], [0, 1, 2, 3, 4, 5, 7])
    assert verdict.summary.startswith("rank 6 (pp 3/4, tp 0): its state cannot be read (rank-6.probe:")
    assert "ranks 0-5, 7 and the driver wait on it" in verdict.summary


def test_an_unreadable_victim_leaves_the_culprit_named(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(os.path.join(RUNS, "rank6_never_reached"), run)
    (run / "rank-7.probe").write_bytes(b"garbage")
    assert culprits(analyze(Collector(str(run)).snapshot())) == [("never_reached", [6])]


def test_an_unreadable_rank_whose_waiters_wait_on_a_named_culprit_adds_nothing():
    named = verdict("never_reached", [6], [0, 1, 2, 3, 4, 5, 7])
    unseen = verdict("state_unreadable", [3], [2])
    assert fold_consequences([named, unseen]) == [named]
