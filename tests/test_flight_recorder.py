"""Flight Recorder dumps -> Snapshot -> the same analyze(): real gloo dumps from
tests/fixtures, NCCL-format dicts, and inputs that must not be trusted."""
import os
import pickle
import shutil
import subprocess
import sys

import pytest

from diagnose.analysis import analyze
from diagnose.offline.flight_recorder import FlightRecorderError, load_dump, looks_like_fr_dir, read_fr_dir
from diagnose.analysis.thresholds import Thresholds
from diagnose.core.snapshot import CollectiveRecord
from diagnose.launch.flight import BUFFER_ENTRIES, fr_env
from helpers.fr_dumps import nccl_dump, nccl_entry

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
POST_MORTEM = Thresholds(stall_s=0.0)


def copy_fixture(name, tmp_path):
    target = tmp_path / name
    shutil.copytree(os.path.join(FIXTURES, name), target)
    return target


def test_real_gloo_dumps_name_the_rank_the_group_waits_for():
    run = read_fr_dir(os.path.join(FIXTURES, "fr_hang"))
    assert run.notes == []
    assert sorted(run.snapshot.ranks) == [0, 1, 2, 3]
    [verdict] = analyze(run.snapshot, POST_MORTEM)
    assert verdict.kind == "collective_missing_peers"
    assert verdict.culprit_ranks == [3]
    assert verdict.victim_ranks == [0, 1, 2]
    assert (verdict.group, verdict.seq) == ("tp1", 5)        # rank 2 waits there alone
    assert "make_fr_dumps.py" in run.snapshot.ranks[2].frame


def test_real_nccl_dumps_from_two_h200s_name_the_rank_that_did_not_join():
    """Made on 2 GPUs by tests/fixtures/make_fr_dumps_nccl.py (torch 2.11, NCCL 2.28):
    rank 1 skipped the world all_reduce of step 3 after its recv."""
    run = read_fr_dir(os.path.join(FIXTURES, "fr_nccl_hang"))
    assert run.notes == []
    [verdict] = analyze(run.snapshot, POST_MORTEM)
    assert verdict.kind == "collective_missing_peers"
    assert (verdict.culprit_ranks, verdict.victim_ranks) == ([1], [0])
    assert (verdict.group, verdict.seq) == ("world", 4)
    recvs = [r for r in run.snapshot.ranks[1].collectives if r.op == "recv"]
    assert recvs and all(r.peer == 0 for r in recvs)


def test_real_gloo_dumps_of_a_healthy_run_give_no_verdict():
    run = read_fr_dir(os.path.join(FIXTURES, "fr_healthy"))
    assert analyze(run.snapshot, POST_MORTEM) == []
    assert all(record.state == "completed"
               for state in run.snapshot.ranks.values() for record in state.collectives)


def test_a_truncated_dump_is_a_note_and_the_rest_is_still_analysed(tmp_path):
    directory = copy_fixture("fr_hang", tmp_path)
    victim = directory / "nccl_trace_rank_0"
    victim.write_bytes(victim.read_bytes()[:700])
    (directory / "nccl_trace_rank_9").write_bytes(b"")
    run = read_fr_dir(str(directory))
    assert run.notes == ["nccl_trace_rank_0: truncated pickle, skipped",
                         "nccl_trace_rank_9: empty file, skipped"]
    [verdict] = analyze(run.snapshot, POST_MORTEM)
    assert verdict.culprit_ranks == [3]
    assert verdict.victim_ranks == [1, 2]


def test_the_unpickler_refuses_objects_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps({"version": "2.10", "entries": [Payload()]}))
    with pytest.raises(FlightRecorderError, match="refusing to load posix.mkdir"):
        load_dump(str(path))
    assert not marker.exists()
    with pytest.raises(FlightRecorderError, match="no readable Flight Recorder dump"):
        read_fr_dir(str(tmp_path))


@pytest.mark.parametrize("content, message", [
    (b"\x80\x04\xffjunk", "not a Flight Recorder dump"),
    (pickle.dumps(["a", "list"]), "no 'entries' list"),
    (pickle.dumps({"entries": "nope"}), "no 'entries' list"),
])
def test_corrupt_dumps_are_refused_with_a_reason(tmp_path, content, message):
    path = tmp_path / "trace_rank_1"
    path.write_bytes(content)
    with pytest.raises(FlightRecorderError, match=message):
        load_dump(str(path))


def test_a_directory_without_dumps_is_an_error(tmp_path):
    assert not looks_like_fr_dir(str(tmp_path))
    with pytest.raises(FlightRecorderError, match="the directory is empty"):
        read_fr_dir(str(tmp_path))
    (tmp_path / "notes.txt").write_text("hello")
    assert not looks_like_fr_dir(str(tmp_path))


def test_nccl_dumps_name_the_rank_missing_from_the_majority_even_without_its_dump(tmp_path):
    groups = {"0": ("default_pg", [0, 1, 2, 3])}
    world = ("0", "default_pg")
    for rank in (0, 1, 3):                                    # rank 2 left no dump
        entries = [nccl_entry(i, world, i + 1, "nccl:all_reduce", "completed") for i in range(6)]
        entries.append(nccl_entry(6, world, 7, "nccl:all_reduce", "started"))
        (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(nccl_dump(entries, groups)))
    run = read_fr_dir(str(tmp_path))
    assert run.notes == ["rank 2: in a process group but no dump; kept without records"]
    [verdict] = analyze(run.snapshot, POST_MORTEM)
    assert verdict.kind == "collective_missing_peers"
    assert verdict.culprit_ranks == [2] and verdict.victim_ranks == [0, 1, 3]
    assert (verdict.group, verdict.seq) == ("world", 7)
    assert run.snapshot.ranks[0].frame == "model.py:42 forward"


def test_nccl_send_recv_are_matched_per_peer_in_global_ranks(tmp_path):
    groups = {"0": ("default_pg", [0, 1, 2, 3]), "5": ("pp", [2, 3])}
    pp = ("5", "pp")
    sender = [nccl_entry(0, pp, 0, "nccl:send 0->1", "completed", p2p_seq=1)]
    receiver = [nccl_entry(0, pp, 0, "nccl:recv 1<-0", "completed", p2p_seq=1),
                nccl_entry(1, pp, 0, "nccl:recv 1<-0", "scheduled", p2p_seq=2)]
    (tmp_path / "trace_2").write_bytes(pickle.dumps(nccl_dump(sender, groups)))
    (tmp_path / "trace_3").write_bytes(pickle.dumps(nccl_dump(receiver, groups)))
    run = read_fr_dir(str(tmp_path))
    recv = run.snapshot.ranks[3].collectives[-1]
    assert (recv.op, recv.peer, recv.seq, recv.state) == ("recv", 2, 1, "enqueued")
    [verdict] = analyze(run.snapshot, POST_MORTEM)
    assert verdict.culprit_ranks == [2] and verdict.victim_ranks == [3]


def test_each_field_of_an_entry_lands_in_its_field_of_the_record(tmp_path):
    """A worker's row is a record's fields in order, the group still the pg name
    and the peer group-local until the groups are known."""
    groups = {"0": ("default_pg", [0, 1, 2, 3]), "5": ("pp", [2, 3])}
    recv = nccl_entry(0, ("5", "pp"), 0, "nccl:recv 1<-0", "completed", p2p_seq=1)
    recv.update(input_sizes=[[2, 8]], output_sizes=[[2, 8]], input_dtypes=["Half"],
                output_dtypes=["Half"], time_discovered_completed_ns=1_700_000_002_500_000_000)
    reduce = nccl_entry(1, ("0", "default_pg"), 9, "nccl:all_reduce", "scheduled")
    (tmp_path / "trace_3").write_bytes(pickle.dumps(nccl_dump([recv, reduce], groups)))
    received, reducing = read_fr_dir(str(tmp_path)).snapshot.ranks[3].collectives
    assert received == CollectiveRecord(
        "pp", 0, "recv", 2, [[2, 8]], "Half", 0, "model.py:42 forward", "completed",
        1_700_000_000.0, 1_700_000_002.5, part=0, out_shapes=[[2, 8]], out_dtype="Half")
    assert reducing == CollectiveRecord(
        "world", 9, "all_reduce", None, [[4, 64]], "Float", 0, "model.py:42 forward",
        "enqueued", 1_700_000_001.0, None, part=0, out_shapes=[[4, 64]], out_dtype="Float")


def test_a_dump_with_an_entry_torch_never_writes_is_unreadable_whole(tmp_path):
    """Skipping the entry would make its rank seem not to have made that call."""
    groups = {"0": ("default_pg", [0, 1])}
    world = ("0", "default_pg")
    good = [nccl_entry(0, world, 1, "nccl:all_reduce", "completed")]
    (tmp_path / "trace_0").write_bytes(pickle.dumps(nccl_dump(good + ["not a dict"], groups)))
    (tmp_path / "trace_1").write_bytes(pickle.dumps(nccl_dump(good + [{"record_id": 1}], groups)))
    (tmp_path / "trace_2").write_bytes(pickle.dumps(nccl_dump(good, groups)))
    run = read_fr_dir(str(tmp_path))
    assert run.notes == ["trace_0: entry 1: not a dict, skipped",
                         "trace_1: entry 1: a process_group that is not (name, desc), skipped"]
    assert sorted(run.snapshot.unreadable) == [0, 1] and list(run.snapshot.ranks) == [2]


PRODUCE_DUMP = """
import os, sys, torch, torch.distributed as dist
os.environ["TORCH_FR_BUFFER_SIZE"] = "50"
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
group = dist.new_group([0], group_desc="tp0")
dist.all_reduce(torch.ones(3, 5), group=group)
open(sys.argv[1], "wb").write(torch._C._distributed_c10d._dump_fr_trace())
dist.destroy_process_group()
"""


@pytest.mark.e2e
def test_the_installed_torch_writes_what_the_reader_expects(tmp_path):
    target = tmp_path / "nccl_trace_rank_0"
    subprocess.run([sys.executable, "-c", PRODUCE_DUMP, str(target)], check=True, timeout=60)
    run = read_fr_dir(str(tmp_path))
    [record] = run.snapshot.ranks[0].collectives
    assert (record.group, record.op, record.seq, record.shapes) == ("tp0", "all_reduce", 1, [[3, 5]])
    assert record.state == "completed"


def test_ages_come_from_the_dumps_own_clock_wherever_the_files_are(tmp_path):
    """Copied to another machine a day later, the dumps still say what they said."""
    directory = copy_fixture("fr_nccl_hang", tmp_path)
    for path in directory.iterdir():
        os.utime(path, (2e9, 2e9))
    run = read_fr_dir(str(directory))
    newest = max(max(record.t_enqueue, record.t_complete or 0.0)
                 for state in run.snapshot.ranks.values() for record in state.collectives)
    assert run.snapshot.taken_at == newest
    [verdict] = analyze(run.snapshot, POST_MORTEM)
    assert "was 0 s before the snapshot" in verdict.summary


def test_a_dtype_given_as_one_string_is_that_dtype(tmp_path):
    groups = {"0": ("default_pg", [0, 1])}
    for rank, rows in ((0, 4), (1, 8)):
        entry = nccl_entry(0, ("0", "default_pg"), "1", "nccl:all_reduce", "completed")
        entry["input_dtypes"] = entry["output_dtypes"] = "float32"
        entry["input_sizes"] = entry["output_sizes"] = [[rows, 64]]
        (tmp_path / f"trace_{rank}").write_bytes(pickle.dumps(nccl_dump([entry], groups)))
    run = read_fr_dir(str(tmp_path))
    assert {state.collectives[0].dtype for state in run.snapshot.ranks.values()} == {"float32"}
    [verdict] = analyze(run.snapshot, POST_MORTEM)
    assert "all_reduce [[4, 64]] float32" in verdict.summary


def test_a_group_whose_dumps_list_other_ranks_is_one_group_per_set(tmp_path):
    """A pg name each rank made with itself alone: two groups, not one of two ranks."""
    for rank in (0, 1):
        dump = nccl_dump([nccl_entry(0, ("1", "solo"), 1, "nccl:all_reduce", "completed")],
                         {"0": ("default_pg", [0, 1]), "1": ("solo", [rank])})
        (tmp_path / f"trace_{rank}").write_bytes(pickle.dumps(dump))
    run = read_fr_dir(str(tmp_path))
    assert [state.collectives[0].group for state in run.snapshot.ranks.values()] == [
        "solo[0]", "solo[1]"]
    assert run.snapshot.ranks[1].identity.groups["solo[1]"] == [1]
    assert "solo[1]" not in run.snapshot.ranks[0].identity.groups   # each rank, its own groups


def test_coalesced_calls_keep_their_place_and_a_batch_end_is_no_call(tmp_path):
    world = ("0", "default_pg")
    entries = [nccl_entry(5, world, 3, "nccl:_broadcast_oop", "completed"),
               nccl_entry(6, world, 3, "nccl:_broadcast_oop", "completed"),
               nccl_entry(7, world, 3, "nccl:ALLGATHER_coalesced", "completed"),
               nccl_entry(8, world, 4, "nccl:all_reduce", "completed"),
               nccl_entry(9, world, 4, "nccl:all_reduce", "completed"),
               nccl_entry(10, world, 4, "nccl:send 0->1", "completed"),
               nccl_entry(11, world, 4, "nccl:coalesced", "completed")]
    entries[-1]["is_p2p"] = True
    (tmp_path / "trace_0").write_bytes(pickle.dumps(nccl_dump(entries, {"0": ("default_pg", [0, 1])})))
    records = read_fr_dir(str(tmp_path)).snapshot.ranks[0].collectives
    assert [(r.op, r.seq, r.part) for r in records] == [
        ("_broadcast_oop", 3, None), ("_broadcast_oop", 3, None), ("ALLGATHER_coalesced", 3, None),
        ("all_reduce", 4, 0), ("all_reduce", 4, 1), ("send", 0, 0)]   # the ring cut seq 3's start


@pytest.mark.parametrize("field, value", [
    ("time_created_ns", float("inf")), ("time_created_ns", 10 ** 40), ("time_created_ns", "0"),
    ("collective_seq_id", -1), ("collective_seq_id", True), ("profiling_name", ["nccl"]),
    ("input_sizes", [[4, "64"]]), ("input_sizes", "4x64"), ("input_dtypes", [1]),
    ("process_group", ("0",)), ("record_id", 1.5),
])
def test_an_entry_with_a_field_out_of_type_or_range_makes_its_dump_unreadable(
        tmp_path, field, value):
    world = ("0", "default_pg")
    for rank in (0, 1):
        entries = [nccl_entry(i, world, i + 1, "nccl:all_reduce", "completed") for i in range(3)]
        if rank == 0:
            entries[1][field] = value
        dump = nccl_dump(entries, {"0": ("default_pg", [0, 1])})
        (tmp_path / f"trace_{rank}").write_bytes(pickle.dumps(dump))
    run = read_fr_dir(str(tmp_path))
    [note] = run.notes
    assert note.startswith("trace_0: entry 1: ") and note.endswith(", skipped")
    assert list(run.snapshot.unreadable) == [0]
    assert [record.seq for record in run.snapshot.ranks[1].collectives] == [1, 2, 3]


@pytest.mark.parametrize("user", [{}, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "500"},
                                  {"TORCH_FR_BUFFER_SIZE": "500"}])
def test_diag_launch_sets_the_ring_size_the_user_chose_under_both_names(tmp_path, user):
    added = fr_env(str(tmp_path), user)
    size = "500" if user else BUFFER_ENTRIES
    assert (added["TORCH_NCCL_TRACE_BUFFER_SIZE"], added["TORCH_FR_BUFFER_SIZE"]) == (size, size)


def test_worker_processes_read_many_dumps_as_this_process_does(monkeypatch, tmp_path):
    """Past PARALLEL_FROM dumps, workers read them FILES_PER_TASK at a time: the
    same snapshot, the same notes in the same order, a dump that asks to run
    code refused there as here, and nothing it asks for run."""
    from diagnose.offline import flight_recorder, synth_fr

    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    directory = tmp_path / "fr"
    synth_fr.write_fr_dumps(str(directory), 16, 4, 5, 20)
    (directory / "nccl_trace_rank_7").write_bytes(pickle.dumps({"entries": [Payload()]}))
    (directory / "nccl_trace_rank_9").write_bytes(b"")
    shutil.copy(directory / "nccl_trace_rank_3", directory / "old_nccl_trace_rank_3")
    alone = read_fr_dir(str(directory))
    monkeypatch.setattr(flight_recorder, "PARALLEL_FROM", 2)
    monkeypatch.setattr(flight_recorder, "FILES_PER_TASK", 3)
    spread = read_fr_dir(str(directory))
    assert spread.snapshot == alone.snapshot
    assert spread.notes == alone.notes
    assert "nccl_trace_rank_7: not a Flight Recorder dump (UnpicklingError: refusing to load " \
           "posix.mkdir: a Flight Recorder dump holds plain data only), skipped" in spread.notes
    assert sorted(spread.snapshot.unreadable) == [7, 9]
    assert not marker.exists()
    [verdict] = analyze(spread.snapshot, POST_MORTEM)
    assert verdict.culprit_ranks == analyze(alone.snapshot, POST_MORTEM)[0].culprit_ranks


def test_a_worker_is_ended_by_the_pools_sigterm_whatever_handler_it_inherits():
    """The pool closes by sending SIGTERM to workers blocked on its queue's lock;
    diag's CLI handler, inherited, can miss it, and the close waits forever."""
    import signal

    from diagnose.core import workers

    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        with workers.pool(2) as pool:
            inherited = pool.apply(signal.getsignal, (signal.SIGTERM,))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert inherited == signal.SIG_DFL
