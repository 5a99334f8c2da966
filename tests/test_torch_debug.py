"""torch.distributed.debug's dump directory: a real one from torch 2.13 on gloo
(tests/fixtures/torch_debug, made by tests/fixtures/make_torch_debug_dump.py),
and inputs that must not be trusted."""
import json
import os
import pickle
import shutil

import pytest

from diagnose import cli
from diagnose.offline.torch_debug import read_debug_dir

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
DEBUG = os.path.join(FIXTURES, "torch_debug")


def analyze(capsys, *args):
    code = cli.main(["analyze", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_newest_stacks_dump_gives_each_rank_its_main_threads_frame():
    dump = read_debug_dir(DEBUG)
    names = sorted(os.listdir(DEBUG))
    assert dump.stacks_file == [name for name in names if name.startswith("stacks_")][-1]
    ranks = dump.snapshot.ranks
    assert sorted(ranks) == [0, 1]
    assert ranks[0].frame == "distributed/distributed_c10d.py:3252 all_reduce"
    assert ranks[1].frame.startswith("fixtures/make_torch_debug_dump.py:")
    main = [thread for thread in ranks[0].stacks if thread.startswith("main thread")]
    assert len(main) == 1 and len(ranks[0].stacks) == 2   # the dumping thread has no frames
    assert ranks[0].stacks[main[0]][0] == "<string>:1 <module>"
    assert all(state.identity.host for state in ranks.values())


def test_diag_analyze_shows_the_stacks_and_says_they_name_no_culprit(capsys):
    code, out, err = analyze(capsys, DEBUG, "--json")
    body = json.loads(out)
    assert code == 0 and err == "" and body["verdicts"] == []
    assert [row["frame"] for row in body["ranks"]][0].endswith("all_reduce")
    assert any("no fr_trace dump" in note for note in body["notes"])
    code, out, _ = analyze(capsys, DEBUG)
    assert "no verdict: no rank recorded a phase or a collective to judge by" in out


def test_beside_flight_recorder_dumps_the_stacks_go_to_their_ranks(tmp_path, capsys):
    both = tmp_path / "both"
    shutil.copytree(os.path.join(FIXTURES, "fr_hang"), both)
    for name in os.listdir(DEBUG):
        shutil.copy(os.path.join(DEBUG, name), both)
    code, out, _ = analyze(capsys, both, "--json")
    body = json.loads(out)
    assert code == 1 and body["verdicts"][0]["culprit_ranks"] == [3]   # the dumps judge
    assert not any("no rank number" in note for note in body["notes"])   # .txt are no dumps


FRAMES_OF_NO_THREAD = "=== Rank 0: http://h:1/ ===\n" + "  File \"x\", line 1 in f\n" * 100000


@pytest.mark.parametrize("content, says", [
    pytest.param("hello\n", "not torch.distributed.debug's stacks dump", id="no-rank-line"),
    pytest.param("", "not torch.distributed.debug's stacks dump", id="empty"),
    pytest.param(FRAMES_OF_NO_THREAD, None, id="frames-of-no-thread"),   # a rank with no stack
])
def test_corrupt_stacks_dumps_are_one_line_errors_or_notes(tmp_path, capsys, content, says):
    (tmp_path / "stacks_20260101_000000.txt").write_text(content)
    code, out, err = analyze(capsys, tmp_path)
    if says is None:
        assert code == 0 and "rank 0 gave no Python stack" in out
        return
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and says in err


def test_a_huge_or_unreadable_stacks_file_is_refused_unread(tmp_path, capsys):
    big = tmp_path / "stacks_20260101_000000.txt"
    with open(big, "wb") as sink:
        sink.truncate(65 << 20)                  # sparse: no disk spent
    code, _, err = analyze(capsys, tmp_path)
    assert code == 2 and "over the" in err and err.count("\n") == 1
    big.unlink()
    os.mkfifo(tmp_path / "stacks_20260101_000001.txt")   # never waited on
    code, _, err = analyze(capsys, tmp_path)
    assert code == 2 and "not a regular file" in err


def test_a_dump_dir_without_stacks_says_which_dump_to_enable(tmp_path, capsys):
    shutil.copy(os.path.join(DEBUG, next(name for name in os.listdir(DEBUG)
                                         if name.startswith("torchcomms"))), tmp_path)
    (tmp_path / "pickle_3").write_bytes(b"no pickle")   # nothing here is unpickled
    code, _, err = analyze(capsys, tmp_path)
    assert code == 2 and "no stacks_<time>.txt: enable the 'stacks' dump" in err


def test_nothing_in_a_debug_dir_is_unpickled(tmp_path, capsys):
    class Boom:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "ran"),))
    shutil.copytree(DEBUG, tmp_path / "d")
    (tmp_path / "d" / "stacks_29990101_000000.txt").write_bytes(pickle.dumps(Boom()))
    analyze(capsys, tmp_path / "d")
    assert not (tmp_path / "ran").exists()
