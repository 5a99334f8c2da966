"""diag synth: synthetic run dirs and Flight Recorder dumps with a planted culprit,
read back by the real collector, Flight Recorder reader and CLI."""
import json
import os
import signal
import subprocess

import pytest

from diagnose.core import runfile
from diagnose.offline import synth
from diagnose.analysis import analyze
from diagnose.launch.collector import Collector
from diagnose.offline.flight_recorder import load_dump
from helpers.run import DIAG, diag, wait_for

RANKS, TP, CULPRIT = 32, 4, 13


@pytest.mark.parametrize("kind", synth.KINDS)
def test_the_collector_and_analysis_name_the_planted_culprit(tmp_path, kind):
    job = synth.hung_job(RANKS, TP, CULPRIT, kind)
    synth.write_run_dir(job.snapshot(), str(tmp_path))
    assert len(list(tmp_path.glob("rank-*.probe"))) == RANKS
    collector = Collector(str(tmp_path))
    snapshot = collector.snapshot()
    assert collector.notes == []
    assert sorted(snapshot.ranks) == list(range(RANKS)) and snapshot.driver is not None
    assert all(state.alive for state in snapshot.ranks.values())   # this process wrote them
    verdict = analyze(snapshot)[0]
    assert verdict.kind == kind
    assert verdict.culprit_ranks == [CULPRIT]
    assert verdict.victim_ranks == [rank for rank in range(RANKS) if rank != CULPRIT]
    assert "the driver wait" in verdict.summary


@pytest.mark.parametrize("kind", synth.KINDS)
def test_a_deep_pipeline_happens_before_the_snapshot_and_has_one_culprit(kind):
    """1,024 stages: every phase and call of the job began before the snapshot
    was taken (stage k begins a step a few ops after stage k-1, so with ops of a
    fixed length the last stages of the hung step began after it, and each was
    named never_reached)."""
    job = synth.hung_job(2048, 2, 1501, kind, steps=2)
    snapshot = job.snapshot()
    times = [time for state in snapshot.ranks.values()
             for time in [event.start for event in state.phases]
             + [event.end for event in state.phases if event.end is not None]
             + [record.t_enqueue for record in state.collectives]]
    assert max(times) < snapshot.taken_at - synth.HANG_S / 2
    verdicts = analyze(snapshot)
    assert [(verdict.kind, verdict.culprit_ranks) for verdict in verdicts] == [(kind, [1501])]


def test_full_rings_hold_the_probes_capacity(tmp_path):
    job = synth.hung_job(RANKS, TP, CULPRIT, "stuck_in_phase", steps=30)
    synth.write_run_dir(job.snapshot(), str(tmp_path))
    state = Collector(str(tmp_path)).snapshot().ranks[0]
    assert len(state.phases) == runfile.PHASE_CAPACITY
    assert len(state.collectives) == runfile.COLLECTIVE_CAPACITY
    assert state.collectives == job.ranks[0].collectives[-runfile.COLLECTIVE_CAPACITY:]
    assert [event.name for event in state.open_phases] == ["dequeue"]


def test_a_synth_dir_whose_writer_is_gone_is_judged_as_it_stood(tmp_path):
    out = tmp_path / "run"
    made = diag("synth", out, "--ranks", RANKS, "--tp", TP, "--culprit", CULPRIT,
                "--kind", "collective_missing_peers")
    assert made.returncode == 0, made.stderr
    assert f"rank {CULPRIT} planted as collective_missing_peers" in made.stdout
    report = diag("analyze", out, "--json")
    assert report.returncode == 1, report.stderr
    body = json.loads(report.stdout)
    [verdict] = body["verdicts"]
    assert (verdict["kind"], verdict["culprit_ranks"]) == ("collective_missing_peers", [CULPRIT])
    assert verdict["evidence"]["job_ended_s_ago"] >= 0
    # the ranks wait, as the verdict says: their processes are gone, no death is named
    states = {row["rank"]: row["state"] for row in body["ranks"]}
    assert states == {rank: "culprit" if rank == CULPRIT else "victim" for rank in range(RANKS)}


def test_flight_recorder_dumps_name_the_rank_that_missed_a_collective(tmp_path):
    out = tmp_path / "run"
    made = diag("synth", out, "--ranks", RANKS, "--tp", TP, "--culprit", CULPRIT,
                "--fr-dumps", "--fr-entries", 40)
    assert made.returncode == 0, made.stderr
    fr_dir = out / synth.FR_DIR
    dumps = sorted(fr_dir.iterdir())
    assert len(dumps) == RANKS
    assert all(len(load_dump(str(path))["entries"]) == 40 for path in dumps)
    report = diag("analyze", fr_dir, "--json")
    assert report.returncode == 1, report.stderr
    [verdict] = json.loads(report.stdout)["verdicts"]
    stage = CULPRIT // TP
    assert verdict["kind"] == "collective_missing_peers"
    assert verdict["culprit_ranks"] == [CULPRIT]
    assert verdict["group"] == f"tp{stage}"
    assert len(verdict["victim_ranks"]) == RANKS - 1


def ctrl_c_reaches_it():
    """A shell without job control starts a background job with SIGINT ignored, and the
    child inherits that: give the command Ctrl-C's default, as at a terminal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def beaten(snapshot, before):
    return snapshot if snapshot.ranks[5].heartbeat_at > before.ranks[5].heartbeat_at else None


def test_beat_keeps_the_ranks_alive_until_interrupted(tmp_path):
    out = tmp_path / "run"
    beater = subprocess.Popen(
        [*DIAG, "synth", str(out), "--ranks", "16", "--tp", "2",
         "--culprit", "5", "--kind", "stuck_in_phase", "--beat"],
        stdout=subprocess.PIPE, text=True, preexec_fn=ctrl_c_reaches_it)
    try:
        assert any(line.startswith("beating") for line in beater.stdout)
        collector = Collector(str(out))
        first = collector.snapshot()
        second = wait_for(lambda: beaten(collector.snapshot(), first), 30,
                          what="a heartbeat of rank 5 newer than the first snapshot's")
        assert all(state.alive for state in second.ranks.values())
        assert analyze(second)[0].culprit_ranks == [5]
    finally:
        beater.send_signal(signal.SIGINT)
        try:
            code = beater.wait(10)
        except subprocess.TimeoutExpired:
            beater.kill()        # fail, but leave no process behind
            beater.wait()
            raise
    assert code == 0
    assert not any(state.alive for state in Collector(str(out)).snapshot().ranks.values())


@pytest.mark.parametrize("args, message", [
    (["--ranks", "30", "--tp", "4"], "--ranks 30 is not a multiple of --tp 4"),
    (["--culprit", "99"], "--culprit 99 is not a rank of 0..31"),
    (["--kind", "wedged"], "--kind 'wedged': one of never_reached, stuck_in_phase, "
                           "collective_missing_peers"),
    (["--ranks", "many"], "argument --ranks: invalid int value: 'many'"),
    (["--tp", "1", "--kind", "collective_missing_peers"], "it needs --tp 2 or more"),
    (["--fr-dumps", "--fr-entries", "0"], "--fr-entries must be at least 1, not 0"),
    (["--tp", "4", "--dp", "3"], "--ranks 32 is not a multiple of --tp 4 x --dp 3"),
    (["--tp", "2", "--dp", "2", "--fr-fault", "gone"], "unknown fault 'gone'"),
])
def test_bad_flags_are_one_line_and_exit_2(tmp_path, args, message):
    result = diag("synth", tmp_path / "run", "--ranks", RANKS, *args)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("fault", ["missing", "stalled_send"])
def test_dp_replicas_are_flight_recorder_dumps_of_a_serving_job(tmp_path, fault):
    out = tmp_path / "dp"
    made = diag("synth", out, "--ranks", 64, "--tp", 4, "--dp", 2, "--culprit", 21,
                "--fr-fault", fault)
    assert made.returncode == 0, made.stderr
    assert "(tp=4 x pp=8 x dp=2), rank 21 planted as" in made.stdout
    assert len(list((out / "fr").glob("nccl_trace_rank_*"))) == 64
    assert not list(out.glob("rank-*.probe"))
    report = diag("analyze", out / "fr", "--json")
    assert report.returncode == 1, report.stderr
    assert [v["culprit_ranks"] for v in json.loads(report.stdout)["verdicts"]] == [[21]]


def test_a_dir_that_is_not_empty_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    result = diag("synth", tmp_path, "--ranks", RANKS)
    assert result.returncode == 2
    assert result.stderr == f"diag: error: {tmp_path}: not empty; synth writes a new run dir\n"
    assert os.listdir(tmp_path) == ["notes.txt"]
