"""`diag analyze` as a user runs it (subprocesses), and its two outputs: the
terminal report and the Perfetto trace."""
import json
import os
import pickle
import shutil
import subprocess
import sys
import time

import pytest
from rich.console import Console

from diagnose import cli
from diagnose.analysis import analyze
from diagnose.offline.perfetto import to_perfetto
from diagnose.offline.report import render, to_json
from helpers.run import REPO, diag
from helpers.synthetic import Job

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
WIDE = {"COLUMNS": "160"}   # the human report, one verdict a line


def assert_one_line_error(result, text):
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("diag: error: ") and text in result.stderr


def test_flight_recorder_dumps_report_the_culprit_and_exit_1():
    result = diag("analyze", os.path.join(FIXTURES, "fr_hang"), env=WIDE)
    assert result.returncode == 1, result.stderr
    assert "rank 3 never joined tp1 all_reduce seq 5" in result.stdout
    assert "ranks 0-2 wait on it" in result.stdout


def test_json_and_perfetto_outputs(tmp_path):
    trace = tmp_path / "trace.json"
    result = diag("analyze", os.path.join(FIXTURES, "fr_hang"), "--json", "--perfetto", str(trace))
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["verdicts"][0]["culprit_ranks"] == [3]
    assert [row["state"] for row in report["ranks"]] == ["victim", "victim", "victim", "culprit"]
    events = json.loads(trace.read_text())["traceEvents"]
    slices = [event for event in events if event["ph"] == "X"]
    assert {event["pid"] for event in slices} == {0, 1, 2, 3}
    hung = [event for event in slices if event["args"].get("open")]
    assert sorted((event["pid"], event["name"]) for event in hung) == [
        (0, "world all_reduce"), (1, "world all_reduce"), (2, "tp1 all_reduce")]


def test_healthy_dumps_exit_0():
    result = diag("analyze", os.path.join(FIXTURES, "fr_healthy"), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["verdicts"] == []


def test_a_run_dir_from_a_live_probe(tmp_path):
    """A real probe in a real process, stuck in a phase; the collector reads it."""
    code = ("import time\nfrom diagnose import probe\n"
            "probe.init('worker', rank=0, world_size=1, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1)\n"
            "with probe.phase('execute_model', step=3):\n"
            "    print('in', flush=True)\n"
            "    time.sleep(30)\n")
    rank = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE,
                            text=True, env=os.environ | {"DIAG_RUN_DIR": str(tmp_path)})
    try:
        assert rank.stdout.readline() == "in\n"
        time.sleep(0.6)
        result = diag("analyze", str(tmp_path), "--stall-timeout", "0.5", "--json")
    finally:
        rank.kill()
        rank.wait()
    assert result.returncode == 1, result.stderr
    [verdict] = json.loads(result.stdout)["verdicts"]
    assert (verdict["kind"], verdict["culprit_ranks"], verdict["step"]) == ("stuck_in_phase", [0], 3)


@pytest.mark.parametrize("args, text", [
    (["frob"], "invalid choice: 'frob'"),
    (["analyze"], "the following arguments are required: path"),
    (["analyze", "/no/such/dir"], "/no/such/dir: no such file or directory"),
    (["analyze", FIXTURES, "--stall-timeout", "soon"], "must be 'auto' or seconds >= 0, not 'soon'"),
    (["analyze", FIXTURES, "--bogus"], "unrecognized arguments: --bogus"),
])
def test_usage_errors_are_one_line(args, text):
    assert_one_line_error(diag(*args), text)


def test_bad_inputs_are_one_line_errors(tmp_path):
    assert_one_line_error(diag("analyze", str(tmp_path)), "neither a run dir")
    afile = tmp_path / "x.txt"
    afile.write_text("x")
    assert_one_line_error(diag("analyze", str(afile)), "not a directory")
    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps({"version": 1})[:5])
    assert_one_line_error(diag("analyze", str(tmp_path)), "no readable Flight Recorder dump")
    probe = tmp_path / "run"
    probe.mkdir()
    (probe / "rank-0.probe").write_bytes(b"not a probe file")
    assert_one_line_error(diag("analyze", str(probe)), "no readable probe file")


def test_an_unwritable_perfetto_path_is_a_one_line_error(tmp_path):
    result = diag("analyze", os.path.join(FIXTURES, "fr_hang"),
                  "--perfetto", str(tmp_path / "missing" / "t.json"))
    assert_one_line_error(result, "--perfetto")


def test_the_report_colours_culprits_and_victims():
    job = Job(now=53.0)
    for rank in job.ranks:
        job.startup(rank, 10.0, stop_in="init_kv_cache" if rank == 6 else None)
    job.driver_step(0, 15.0, None)
    job.step(7, 0, 15.1, stop="forward")
    snapshot = job.snapshot()
    verdicts = analyze(snapshot)
    console = Console(record=True, width=160, color_system="truecolor")
    render(snapshot, verdicts, console=console)
    html = console.export_html(inline_styles=True)
    assert verdicts[0].culprit_ranks == [6]
    assert '<span style="color: #800000; text-decoration-color: #800000; font-weight: bold">' \
           'rank 6 (pp 3/4, tp 0)</span>' in html
    assert "rank 7 and the driver</span>" in html
    rows = to_json(snapshot, verdicts)["ranks"]
    assert [row["state"] for row in rows if row["rank"] in (6, 7)] == ["culprit", "victim"]


def test_perfetto_has_a_track_per_rank_and_the_driver():
    job = Job(now=20.0)
    job.healthy(2, job.everyone_started())
    trace = to_perfetto(job.snapshot())
    names = {event["args"]["name"] for event in trace["traceEvents"]
             if event["name"] == "process_name"}
    assert names == {f"rank {r} (pp {r // 2}/4, tp {r % 2})" for r in range(8)} | {"driver"}
    steps = [event for event in trace["traceEvents"]
             if event.get("name") == "execute_model" and event["pid"] == 5]
    assert [event["args"]["step"] for event in steps] == [0, 1]
    assert all(event["dur"] > 0 for event in steps)


# What diag analyze shows: --ranks, --groups, -p/--prefix (torchfrtrace's selectors).

def analyze_in_process(capsys, *args):
    code = cli.main(["analyze", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_ranks_and_groups_narrow_the_table_never_the_verdict(capsys):
    fr_hang = os.path.join(FIXTURES, "fr_hang")
    code, out, _ = analyze_in_process(capsys, fr_hang, "--json", "--ranks", "0-1")
    body = json.loads(out)
    assert code == 1 and body["verdicts"][0]["culprit_ranks"] == [3]   # still rank 3
    assert [row["rank"] for row in body["ranks"]] == [0, 1]
    assert body["shown"] == {"ranks": [0, 1], "groups": None, "of": 4}
    # torch's desc (tp1) or pg name (2), as --pg-filters takes them; calls there only
    for name in ("tp1", "2"):
        code, out, _ = analyze_in_process(capsys, fr_hang, "--json", "--groups", name)
        rows = json.loads(out)["ranks"]
        assert [(row["rank"], row["last_collective"]) for row in rows] == [
            (2, "tp1 all_reduce #5 waiting"), (3, "tp1 all_reduce #4")]
    code, out, _ = analyze_in_process(capsys, fr_hang, "--ranks", "3", "--groups", "tp1")
    assert "showing rank 3 in tp1 of 4; the verdicts judge every rank" in out
    assert "rank 3 never joined tp1 all_reduce seq 5" in out


@pytest.mark.parametrize("args, says", [
    (["--ranks", "7"], "--ranks: rank 7 not in this job (it has ranks 0-3)"),
    (["--ranks", "1-x"], "argument --ranks: not a rank or a range of ranks: '1-x'"),
    (["--groups", "tp9"], "--groups: no group 'tp9' in this job (it has tp0, tp1, world)"),
    (["-p", "trace_"], "no file named trace_<rank> (--prefix trace_)"),
])
def test_a_selection_the_job_does_not_have_is_a_one_line_error(capsys, args, says):
    code, out, err = analyze_in_process(capsys, os.path.join(FIXTURES, "fr_hang"), *args)
    assert code == 2 and out == ""
    assert err.splitlines() == [f"diag: error: {err.removeprefix('diag: error: ').strip()}"]
    assert says in err


def test_prefix_reads_only_the_files_it_names(tmp_path, capsys):
    dumps = tmp_path / "dumps"
    shutil.copytree(os.path.join(FIXTURES, "fr_hang"), dumps)
    (dumps / "nccl_trace_rank_3").rename(dumps / "other_3")       # not of this prefix
    (dumps / "notes.txt").write_text("mine")
    code, out, _ = analyze_in_process(capsys, dumps, "-p", "nccl_trace_rank_", "--json")
    body = json.loads(out)
    assert [row["rank"] for row in body["ranks"]] == [0, 1, 2]
    assert not any("notes.txt" in note or "other_3" in note for note in body["notes"])


def test_output_writes_the_json_and_the_screen_stays(tmp_path, capsys):
    target = tmp_path / "verdicts.json"
    code, out, _ = analyze_in_process(capsys, os.path.join(FIXTURES, "fr_hang"), "-o", target)
    assert code == 1 and "rank 3 never joined tp1 all_reduce seq 5" in out
    body = json.loads(target.read_text())
    assert body["schema_version"] == 1 and body["verdicts"][0]["culprit_ranks"] == [3]
    code, out, err = analyze_in_process(capsys, os.path.join(FIXTURES, "fr_hang"), "-o",
                                        tmp_path / "no" / "such.json")
    assert code == 2 and err.startswith("diag: error: --output ")


def test_piped_output_keeps_every_field_whole():
    """COLUMNS=80 and a pipe, as in CI: the frame column and the verdict are whole,
    one line each."""
    result = diag("analyze", os.path.join(FIXTURES, "runs", "rank6_never_reached"),
                  env={"COLUMNS": "80"})
    assert result.returncode == 1, result.stderr
    assert "…" not in result.stdout
    lines = result.stdout.splitlines()
    assert any("distributed/distributed_c10d.py:3252 all_reduce" in line and line.startswith("7 ")
               for line in lines)
    assert any("never reached execute_model" in line and "and the driver wait on it" in line
               for line in lines)
    states = [line.split()[4] for line in lines if line[:1].isdigit()]
    assert states == ["victim"] * 6 + ["culprit", "victim"]    # stopped for the hang: no death


def test_a_job_larger_than_a_screen_shows_the_culprits_nearest_and_json_every_rank(
        tmp_path, capsys):
    run = tmp_path / "big"
    assert diag("synth", run, "--ranks", "256", "--culprit", "200").returncode == 0
    code, out, _ = analyze_in_process(capsys, str(run))
    rows = [line.split("│")[0].strip() for line in out.splitlines() if "│" in line]
    shown = [int(rank) for rank in rows if rank.isdigit()]
    assert code == 1 and len(shown) == 48
    assert 200 in shown and shown == sorted(shown)
    assert max(abs(rank - 200) for rank in shown) <= 24     # the nearest 48, the culprit's
    assert "showing 48 of 256 ranks, the culprits' nearest first" in out
    code, out, _ = analyze_in_process(capsys, str(run), "--json")
    assert len(json.loads(out)["ranks"]) == 256
