"""Readers of untrusted files stay bounded: a pickle whose memo index or length
asks for gigabytes, a process group of 100,000 ranks, groups in probe files.
Each is refused or noted in one line; none takes the memory it asks for."""
import os
import pickle
import struct
import subprocess
import sys

import pytest

from diagnose.analysis import analyze
from diagnose.analysis.thresholds import Thresholds
from diagnose.core import groups
from diagnose.core.groups import GroupReader, encode
from diagnose.core.layout import MAX_PARSED_RANKS
from diagnose.offline.flight_recorder import read_fr_dir
from diagnose.offline.fr_groups import MAX_MEMBERS
from helpers.fr_dumps import nccl_dump, nccl_entry

pytestmark = pytest.mark.unit

WORLD = ("0", "default_pg")
MB = 1024 * 1024


# The child's own peak, from /proc: rusage's ru_maxrss of a child forked from this
# process (torch loaded, hundreds of MB) starts at this process's size, whatever
# the child itself takes.
PEAK_OF_DIAG = """import atexit, sys
from diagnose.cli import main
def peak():
    with open("/proc/self/status") as status, open(sys.argv[1], "w") as sink:
        sink.write(next(line for line in status if line.startswith("VmHWM:")).split()[1])
atexit.register(peak)
sys.exit(main(sys.argv[2:]))
"""


def diag_analyze(path) -> tuple[int, str, float]:
    """(exit code, stderr, peak RSS in MB) of `diag analyze PATH`."""
    peak = os.path.join(str(path), os.pardir, "peak-kb")
    child = subprocess.run([sys.executable, "-c", PEAK_OF_DIAG, peak, "analyze", str(path)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           timeout=120)
    with open(peak) as source:
        return child.returncode, child.stderr, int(source.read()) / 1024


@pytest.mark.parametrize("bomb", [
    b"\x80\x04}r" + struct.pack("<I", 2 ** 26) + b".",          # LONG_BINPUT 2**26
    b"\x80\x04}r" + struct.pack("<I", 2 ** 30) + b".",          # LONG_BINPUT 2**30: 16 GB asked
    b"\x80\x04\x8d" + struct.pack("<Q", 2 ** 40) + b"abc",       # BINUNICODE8 of 1 TB
    b"\x80\x04\x8e" + struct.pack("<Q", 2 ** 36) + b"abc",       # BINBYTES8 of 64 GB
], ids=["memo-2**26", "memo-2**30", "unicode8", "bytes8"])
def test_a_pickle_that_asks_for_gigabytes_is_refused_without_taking_them(tmp_path, bomb):
    (tmp_path / "nccl_trace_rank_0").write_bytes(bomb)
    code, stderr, rss_mb = diag_analyze(tmp_path)
    assert code == 2, stderr
    assert "nccl_trace_rank_0: not a Flight Recorder dump" in stderr
    assert stderr.count("\n") == 1 and "Traceback" not in stderr
    assert rss_mb < 200


def test_the_cap_leaves_a_real_dump_readable_and_is_lifted_after(tmp_path):
    import resource
    before = resource.getrlimit(resource.RLIMIT_AS)
    entries = [nccl_entry(i, WORLD, i + 1, "nccl:all_reduce", "completed") for i in range(2000)]
    for rank in (0, 1):
        (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(
            pickle.dumps(nccl_dump(entries, {"0": ("default_pg", [0, 1])})))
    run = read_fr_dir(str(tmp_path))
    assert [len(state.collectives) for state in run.snapshot.ranks.values()] == [2000, 2000]
    assert resource.getrlimit(resource.RLIMIT_AS) == before


def one_dump_of_a_group(tmp_path, members: int):
    entries = [nccl_entry(0, WORLD, 1, "nccl:all_reduce", "started")]
    (tmp_path / "nccl_trace_rank_0").write_bytes(
        pickle.dumps(nccl_dump(entries, {"0": ("default_pg", list(range(members)))})))


def test_a_group_over_the_cap_is_one_note_and_its_members_are_who_took_part(tmp_path):
    one_dump_of_a_group(tmp_path, 100_000)
    run = read_fr_dir(str(tmp_path))
    assert run.notes == [f"nccl_trace_rank_0: process group 0 lists over {MAX_MEMBERS} ranks; "
                         f"its members are the ranks with entries in it"]
    assert list(run.snapshot.ranks) == [0]
    code, stderr, rss_mb = diag_analyze(tmp_path)
    assert code in (0, 1) and "Traceback" not in stderr
    assert rss_mb < 200


def test_ranks_of_a_large_group_without_dumps_are_one_note_and_named(tmp_path):
    one_dump_of_a_group(tmp_path, 4000)
    run = read_fr_dir(str(tmp_path))
    assert run.notes == ["ranks 1-3999: in a process group but no dump; kept without records"]
    verdicts = analyze(run.snapshot, Thresholds(stall_s=0.0))
    assert sorted(rank for verdict in verdicts for rank in verdict.culprit_ranks) \
        == list(range(1, 4000))
    assert all(verdict.victim_ranks == [0] for verdict in verdicts)


def test_groups_are_written_as_ranges_and_read_once_for_every_rank():
    written = encode({"tp1": [8, 9, 10, 11], "pp": list(range(16384)), "odd": [0, 1, 2, 3, 6]})
    assert written == {"tp1": "8-11", "pp": "0-16383", "odd": "0-3,6"}
    reader = GroupReader()
    first, second = reader.read(written), reader.read(dict(written))
    assert first == {"tp1": [8, 9, 10, 11], "pp": list(range(16384)), "odd": [0, 1, 2, 3, 6]}
    assert second["pp"] is first["pp"]
    assert reader.read({"tp0": [0, 1]}) == {"tp0": [0, 1]}      # what earlier probes wrote


@pytest.mark.parametrize("groups, message", [
    ({"a": f"0-{MAX_PARSED_RANKS}"}, "holds more than"),
    ({"a": f"0-{MAX_PARSED_RANKS // 2}", "b": f"1-{MAX_PARSED_RANKS // 2 + 1}"}, "in all"),
    ({"a": ",".join(["0-1048575"] * 3)}, "holds more than"),
    ({"a": "0-3,x"}, "not a rank"),
    ({"a": 7}, "neither ranges nor a list"),
    ({"a": [0, True]}, "not a rank"),
])
def test_groups_no_writer_writes_are_refused(groups, message):
    with pytest.raises(ValueError, match=message):
        GroupReader().read(groups)


def test_a_run_dir_cannot_make_the_reader_keep_more_than_its_budget(monkeypatch):
    monkeypatch.setattr(groups, "MAX_KEPT", 100)
    reader = GroupReader()
    for start in range(0, 100, 10):
        reader.read({"g": f"{start}-{start + 9}"})
    assert reader.read({"g": "0-9"})["g"] == list(range(10))       # known: nothing more kept
    with pytest.raises(ValueError, match="over 100 distinct members in this run dir"):
        reader.read({"g": "100-109"})
