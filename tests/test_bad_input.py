"""`diag analyze` on input that is not what diag or torch writes: one line on
stderr and exit 2, never a traceback, a hang, or exit 1 (verdicts found)."""
import json
import os
import pickle
import resource
import shutil
import struct

import pytest

from diagnose.core import runfile
from helpers.fr_dumps import nccl_dump, nccl_entry
from helpers.run import diag

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = os.path.join(ROOT, "tests", "fixtures", "runs")
PID_AT = 16                              # the header's pid: see docs/run-dir.md


def diag_analyze(path, memory_limit=None):
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    return diag("analyze", path, preexec_fn=limit if memory_limit else None)


def assert_refused(result, text):
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("diag: error: ") and text in result.stderr, result.stderr


def rank_file(tmp_path, rank=0):
    """A real probe file (rank 0 of the recorded healthy run), alone in a run dir."""
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    target = run / f"rank-{rank}.probe"
    shutil.copy(os.path.join(RUNS, "no_fault", "rank-0.probe"), target)
    return run, target


def with_identity(path, change):
    """Rewrites the identity JSON of a probe file and the header's sizes with it."""
    raw = bytearray(path.read_bytes())
    header = list(runfile.HEADER.unpack_from(raw))
    identity = json.loads(raw[runfile.IDENTITY_AT:])
    change(identity)
    body = json.dumps(identity).encode()
    header[2], header[12] = runfile.IDENTITY_AT + len(body), len(body)
    runfile.HEADER.pack_into(raw, 0, *header)
    path.write_bytes(bytes(raw[:runfile.IDENTITY_AT]) + body)


def test_a_fifo_named_like_a_probe_file_is_not_waited_on(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "rank-6.probe")
    assert_refused(diag_analyze(run), "rank-6.probe: not a regular file")


def test_a_fifo_beside_real_probe_files_is_a_note(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(os.path.join(RUNS, "no_fault"), run)
    os.mkfifo(run / "rank-8.probe")
    os.mkfifo(run / "stacks-0.json")
    result = diag_analyze(run)
    # the healthy ranks are shown, but a run with an unreadable probe file and no
    # verdict is no healthy run: bad input, exit 2, with the reason
    assert result.returncode == 2, result.stderr
    assert "rank-8.probe: not a regular file" in result.stdout
    assert "cannot be called healthy" in result.stderr


def test_a_directory_named_like_a_probe_file(tmp_path):
    run = tmp_path / "run"
    (run / "rank-5.probe").mkdir(parents=True)
    assert_refused(diag_analyze(run), "rank-5.probe: not a regular file")


def test_a_probe_header_with_pid_minus_one(tmp_path):
    run, target = rank_file(tmp_path)
    raw = bytearray(target.read_bytes())
    struct.pack_into("<q", raw, PID_AT, -1)
    target.write_bytes(bytes(raw))
    assert_refused(diag_analyze(run), "pid -1 is no process's")


@pytest.mark.parametrize("groups", ["tp0", {"tp0": "0,x"}, {"tp0": "0-2000000"}, {"tp0": 7},
                                    {"tp0": [0, "1"]}, [[0, 1]]])
def test_identity_groups_of_the_wrong_type(tmp_path, groups):
    run, target = rank_file(tmp_path)
    with_identity(target, lambda identity: identity.update(groups=groups))
    assert_refused(diag_analyze(run), "identity fields: Identity.groups")


def test_an_identity_nested_100000_deep(tmp_path):
    run, target = rank_file(tmp_path)
    raw = bytearray(target.read_bytes()[:runfile.IDENTITY_AT])
    body = b"[" * 100_000 + b"]" * 100_000
    header = list(runfile.HEADER.unpack_from(raw))
    header[2], header[12] = runfile.IDENTITY_AT + len(body), len(body)
    runfile.HEADER.pack_into(raw, 0, *header)
    target.write_bytes(bytes(raw) + body)
    assert_refused(diag_analyze(run), "identity is not JSON")


@pytest.mark.parametrize("content", ['{"command_exit": Infinity}', '{"command_exit": "1"}',
                                     '{"command_exit": true}', "[" * 100_000, "{"])
def test_an_exit_file_diag_launch_never_writes(tmp_path, content):
    run = tmp_path / "run"
    shutil.copytree(os.path.join(RUNS, "no_fault"), run)
    (run / "exit.json").write_text(content)
    assert_refused(diag_analyze(run), "exit.json: ")


@pytest.mark.parametrize("field, value", [("received_at", "yesterday"),
                                          ("expected_since", "now"), ("received_at", 1e999)])
def test_a_node_file_with_times_that_are_no_times(tmp_path, field, value):
    run = tmp_path / "run"
    shutil.copytree(os.path.join(RUNS, "no_fault"), run)
    report = {"node_rank": 1, "host": "b", "expected_since": 1.0, "received_at": 2.0,
              "connected": True, "finished": False, "dropped": False, "command_exit": None,
              "dump_done": 0, "ranks": {}}
    (run / "node-1.json").write_text(json.dumps(report | {field: value}))
    assert_refused(diag_analyze(run), f"node-1.json: NodeReport.{field}")


def write_dump(directory, entries):
    directory.mkdir(exist_ok=True)
    dump = nccl_dump(entries, {"0": ("default_pg", [0])})
    (directory / "nccl_trace_rank_0").write_bytes(pickle.dumps(dump))


@pytest.mark.parametrize("time", [float("inf"), float("nan"), 10 ** 40])
def test_flight_recorder_entries_with_times_that_are_no_times(tmp_path, time):
    entry = nccl_entry(0, ("0", "default_pg"), 1, "nccl:all_reduce", "completed")
    entry["time_created_ns"] = time
    write_dump(tmp_path / "fr", [entry])
    assert_refused(diag_analyze(tmp_path / "fr"), "nccl_trace_rank_0: entry 0: a time that is ")


def nested(depth: int) -> bytes:
    """A list nested `depth` deep, as pickle opcodes (pickle.dumps would recurse)."""
    return b"]" * depth + b"a" * (depth - 1)


@pytest.mark.parametrize("field", ["profiling_name", "process_group", "input_sizes",
                                   "input_dtypes", "frames", "collective_seq_id"])
def test_flight_recorder_entries_nested_100000_deep(tmp_path, field):
    entries = [nccl_entry(i, ("0", "default_pg"), i + 1, "nccl:all_reduce", "completed")
               for i in range(2)]
    entries[1][field] = "DEEPMARK"
    raw = pickle.dumps(nccl_dump(entries, {"0": ("default_pg", [0])}), protocol=2)
    marker = b"X\x08\x00\x00\x00DEEPMARK"                   # BINUNICODE "DEEPMARK"
    assert raw.count(marker) == 1
    raw = raw.replace(marker, nested(100_000))
    (tmp_path / "nccl_trace_rank_0").write_bytes(raw)
    result = diag_analyze(tmp_path)
    if field == "frames":                     # they only name the call site: none then
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    else:
        assert_refused(result, "nccl_trace_rank_0: entry 1: ")


def test_a_10_gb_dump_under_a_memory_limit_is_refused_unread(tmp_path):
    dump = tmp_path / "nccl_trace_rank_0"
    with open(dump, "wb") as sink:
        sink.write(pickle.dumps({"entries": []})[:2])
        sink.truncate(10 << 30)                   # sparse: no disk is used
    result = diag_analyze(tmp_path, memory_limit=1 << 30)
    assert_refused(result, "nccl_trace_rank_0: 10.0 GiB, over the 256 MiB a dump may have")
