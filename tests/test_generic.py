"""Generic mode: diag launch around torchrun programs we did not write for it
(tests/programs/), with faults the programs inject themselves (TOY_FAULT)."""
import json
import os
import re
import subprocess
import sys


from diagnose.analysis import analyze
from diagnose.launch.options import BOOTSTRAP_DIR
from diagnose.core.vocab import Phase
from diagnose.launch.collector import Collector
from diagnose.core.snapshot import Identity
from diagnose.analysis.thresholds import Thresholds
from helpers.run import detect_bound, diag, launch, torchrun
from helpers.synthetic import Job

BOOTSTRAP = BOOTSTRAP_DIR
DETECT_S = 5.0


def launch_toy(tmp_path, program, nproc, fault="", marks=()):
    """diag launch around torchrun of tests/programs/PROGRAM with TOY_FAULT=fault."""
    flags = [arg for mark in marks for arg in ("--mark", mark)]
    return launch(tmp_path, torchrun(program, nproc), *flags, env={"TOY_FAULT": fault},
                      timeout=90)


def verdicts_of(body):
    return [(v["kind"], v["culprit_ranks"]) for v in body["verdicts"]]


def analyze_again(run_dir):
    done = diag("analyze", run_dir, "--json")
    return verdicts_of(json.loads(done.stdout))


def test_healthy_run_has_no_verdict_and_no_agent_file(tmp_path):
    done, body, run_dir = launch_toy(tmp_path, "dp_train.py", 2)
    assert done.returncode == 0, done.stderr[-2000:]
    assert body["verdicts"] == []
    probes = sorted(name for name in os.listdir(run_dir) if name.endswith(".probe"))
    assert probes == ["rank-0.probe", "rank-1.probe"]          # torchrun's agent wrote none
    ranks = Collector(str(run_dir)).snapshot().ranks
    assert {record.op for state in ranks.values() for record in state.collectives} == {
        "all_reduce", "barrier"}
    site = ranks[1].collectives[-1].site      # the program's line, not diagnose/ or torch's
    assert site.startswith("programs/dp_train.py:") and site.endswith(" main")


def test_rank_that_skips_all_reduce_is_named(tmp_path):
    done, body, run_dir = launch_toy(tmp_path, "dp_train.py", 2, "skip_allreduce:1:5")
    assert done.returncode == 1, done.stderr[-2000:]   # a verdict
    verdict = body["verdicts"][0]
    assert (verdict["kind"], verdict["culprit_ranks"]) == ("collective_missing_peers", [1])
    assert (verdict["group"], verdict["seq"]) == ("world", 5)
    assert verdict["detected_after_s"] < detect_bound(verdict, DETECT_S)
    assert analyze_again(run_dir)[0] == ("collective_missing_peers", [1])


def test_a_call_skipped_long_before_it_surfaces_is_placed_by_its_call_site(tmp_path):
    """Rank 2 skips the all_reduce of step 10 and trains on: its calls pair with
    its peers' next ones until its final barrier meets their last all_reduce,
    29 calls later. Counted per call site, it made one all_reduce fewer."""
    done, body, run_dir = launch_toy(tmp_path, "dp_train.py", 4, "skip_once:2:10")
    assert done.returncode == 1, done.stderr[-2000:]   # a verdict
    verdict = body["verdicts"][0]
    assert (verdict["kind"], verdict["culprit_ranks"], verdict["seq"]) == (
        "collective_mismatch", [2], 39)
    # the mismatch is named as soon as rank 2's barrier meets a peer's all_reduce:
    # rank 3, on a loaded machine, may not have reached that call yet
    assert re.search(r"rank 2 made 39 all_reduce calls at programs/toy_steps\.py:42 train_step "
                     r"where ranks 0-1( and 3)? made 40$", verdict["summary"]), verdict["summary"]
    counts = verdict["evidence"]["calls_per_site"]["counts"]
    made = counts["all_reduce calls at programs/toy_steps.py:42 train_step"]
    assert made.pop("2") == 39 and {"0", "1"} <= set(made) <= {"0", "1", "3"}
    assert set(made.values()) == {40}
    assert analyze_again(run_dir)[0] == ("collective_mismatch", [2])


def test_pipeline_stage_that_never_sends_is_named(tmp_path):
    done, body, run_dir = launch_toy(tmp_path, "pipeline.py", 4, "no_send:2:5")
    assert done.returncode == 1, done.stderr[-2000:]   # a verdict
    verdict = body["verdicts"][0]
    assert verdict["culprit_ranks"] == [2]
    assert 3 in verdict["victim_ranks"]
    assert "recv seq 5" in verdict["summary"]
    assert verdict["detected_after_s"] < detect_bound(verdict, DETECT_S)
    assert analyze_again(run_dir)[0] == (verdict["kind"], [2])


def test_rank_that_exits_is_dead(tmp_path):
    done, body, run_dir = launch_toy(tmp_path, "dp_train.py", 2, "exit:1:5")
    assert done.returncode == 4, done.stderr[-2000:]       # the job crashed
    verdict = body["verdicts"][0]
    assert (verdict["kind"], verdict["culprit_ranks"]) == ("dead", [1])
    assert verdict["evidence"]["alive"] is False                 # docs/json.md: its row is dead
    assert [row["state"] for row in body["ranks"] if row["rank"] == 1] == ["dead"]
    assert verdict["detected_after_s"] < detect_bound(verdict, DETECT_S)
    assert analyze_again(run_dir)[0] == ("dead", [1])


def test_mark_is_a_phase_and_never_reached_works(tmp_path):
    done, body, run_dir = launch_toy(tmp_path, "dp_train.py", 2, "late_start:1:0",
                                 marks=["toy_steps:train_step", "toy_steps:no_such_step=x"])
    assert done.returncode == 1, done.stderr[-2000:]   # a verdict
    verdict = body["verdicts"][0]
    assert (verdict["kind"], verdict["culprit_ranks"], verdict["phase"]) == (
        "never_reached", [1], "train_step")
    assert verdict["detected_after_s"] < detect_bound(verdict, DETECT_S)
    assert body["ranks"][0]["phase"] == "train_step"
    assert "toy_steps has no no_such_step; mark ignored" in (run_dir / "output.log").read_text()
    assert analyze_again(run_dir)[0] == ("never_reached", [1])


def test_bootstrap_chains_and_stays_lazy(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("print('theirs ran')\n")
    probe_check = "import sys; print('torch' in sys.modules, 'diagnose.probe.torch_dist' in sys.modules)"
    path = os.pathsep.join([BOOTSTRAP, str(tmp_path)])
    off = subprocess.run([sys.executable, "-c", probe_check], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=path), timeout=30)
    assert off.stdout.split("\n")[:2] == ["theirs ran", "False False"]
    on = subprocess.run([sys.executable, "-c", probe_check], capture_output=True, text=True,
                        env=dict(os.environ, PYTHONPATH=path, DIAG_RUN_DIR=str(tmp_path / "run")),
                        timeout=30)
    assert on.stdout.split("\n")[:2] == ["theirs ran", "False True"]
    assert not (tmp_path / "run").exists()


def test_a_job_on_another_python_gets_the_probe_and_none_of_the_debuggers_packages(tmp_path):
    """The job's Python is a bare venv: under diag launch it gets the probe (and the
    psutil it needs) from the debugger, and still finds no torch or triton, which the
    debugger's environment has: a job must not import a version of them it was not
    built with."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")],
                   check=True, timeout=60)
    job = ("import importlib.util, sys; import diagnose.probe.recorder, psutil; "
           "print('job sees', [name for name in ('torch', 'triton', 'textual') "
           "if importlib.util.find_spec(name)], 'probe' if 'diagnose.probe.torch_dist' in "
           "sys.modules else 'no probe', 'psutil' if psutil.pids() else '')")
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "diagnose.cli", "launch", "--run-dir",
                           str(run_dir), "--", str(tmp_path / "bare" / "bin" / "python"), "-c", job],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "job sees [] probe psutil" in (run_dir / "output.log").read_text()


def _generic_job() -> Job:
    job = Job(tp=1, pp=2)
    for rank, state in job.ranks.items():
        state.identity = Identity(role="process", rank=rank, world_size=2, tp_rank=None,
                                  tp_size=None, pp_rank=None, pp_size=None, host="host",
                                  pid=1000 + rank, device="cpu", groups={"world": [0, 1]})
    return job


def test_process_that_ended_normally_is_not_dead():
    job = _generic_job()
    for rank, state in job.ranks.items():
        job.phase(state, Phase.EXIT, 990.0, 990.001)
        state.alive = False
    job.ranks[1].phases.clear()   # rank 1 ended without the clean-exit phase
    verdicts = analyze(job.snapshot(), Thresholds())
    assert [(v.kind, v.culprit_ranks) for v in verdicts] == [("dead", [1])]


def test_death_that_followed_a_peer_death_is_a_victim():
    """Rank 0 died waiting in an all_reduce that dead rank 1 never joined; its
    last heartbeat is the earlier of the two, by less than heartbeats can tell."""
    job = _generic_job()
    job.record(0, "world", "all_reduce", 990.0, 990.01)
    job.record(1, "world", "all_reduce", 990.0, 990.01)
    job.record(0, "world", "all_reduce", 990.5, None)
    job.command_exit = 1
    snapshot = job.snapshot()
    for rank, beat in ((0, 990.55), (1, 990.6)):
        snapshot.ranks[rank].alive = False
        snapshot.ranks[rank].heartbeat_at = beat
    verdict = analyze(snapshot, Thresholds())[0]
    assert (verdict.kind, verdict.culprit_ranks, verdict.victim_ranks) == ("dead", [1], [0])
