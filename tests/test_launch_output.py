"""What `diag launch` tells people, through pipes as in CI: the command's output
as it comes, each verdict once, a command that fails before any rank started
said to have failed (with its exit code and last lines), and ranks that ended
normally as exited, not dead."""
import json
import os
import signal
import sys
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from diagnose.core.vocab import VerdictKind
from diagnose.launch import judged_file
from diagnose.launch.launcher import REPUBLISH_S
from helpers.run import PROGRAMS, free_port, launch_process, left_behind, wait_for

TWO_RANKS = [sys.executable, os.path.join(PROGRAMS, "two_ranks.py")]


def hang_seen_for(port: int, seconds: float) -> bool:
    """diag's own /metrics say it names a hang and has seen no progress for `seconds`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        samples = {sample.name: sample.value
                   for family in text_string_to_metric_families(reply.read().decode())
                   for sample in family.samples if not sample.labels}
    return (samples.get("hangscope_hung") == 1
            and samples.get("hangscope_progress_age_seconds", 0) >= seconds)


def test_ranks_that_end_normally_are_exited_in_the_summary_and_the_report(tmp_path):
    done = launch_process(tmp_path / "run", [*TWO_RANKS, "clean"])
    out, err = done.communicate(timeout=60)
    assert done.returncode == 0, err
    assert "rank 0: 5 steps done" in err and "rank 1: 5 steps done" in err  # the output, as it came
    rows = [[cell.strip() for cell in line.split("│")] for line in out.splitlines() if line[:1].isdigit()]
    assert [(row[0], row[2]) for row in rows] == [("0", "exited"), ("1", "exited")], out
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert [row["state"] for row in report["ranks"]] == ["exited", "exited"]
    judged = judged_file.read(str(tmp_path / "run"))
    assert judged is not None and judged.verdicts == []
    ended = json.loads((tmp_path / "run" / "exit.json").read_text())["ended_at"]
    assert judged.taken_at >= ended - 1.0                 # written again at the end


def test_a_hang_is_printed_once_however_long_it_lasts(tmp_path):
    run_dir = tmp_path / "run"
    port = free_port()
    diag = launch_process(run_dir, [*TWO_RANKS, "hang"], "--on-hang", "report",
                          "--stall-timeout", "0.5", "--metrics-port", port)
    try:
        # written at the hang, with its dumps; then diag sees the same hang for 3 s
        # more of its polls: "for 4 s", "for 5 s", ...
        wait_for(lambda: diag.poll() is not None or (run_dir / "report.json").exists(), 30,
                 what="report.json")
        assert diag.poll() is None
        written, since = (run_dir / judged_file.NAME).stat().st_mtime_ns, time.monotonic()
        wait_for(lambda: hang_seen_for(port, 4.0), 60, what="4 s of the hang on /metrics")
        judged = judged_file.read(str(run_dir))      # for diag tui
        assert [(v.kind, v.culprit_ranks) for v in judged.verdicts] == [
            (VerdictKind.NEVER_REACHED, [0])]
        if time.monotonic() - since < REPUBLISH_S:   # not written again at every poll
            assert (run_dir / judged_file.NAME).stat().st_mtime_ns == written
        diag.send_signal(signal.SIGTERM)
        _, err = diag.communicate(timeout=30)
    finally:
        diag.kill()
    verdicts = [line for line in err.splitlines() if line.startswith("diag: never_reached: ")]
    assert len(verdicts) == 1, err
    assert "rank 0 (pp 0/1, tp 0) never reached execute_model step 2" in verdicts[0]
    assert diag.returncode == 128 + signal.SIGTERM
    assert not left_behind(run_dir)


def test_a_command_that_fails_before_any_rank_started_says_so_and_is_a_crash(tmp_path):
    done = launch_process(tmp_path / "run", [sys.executable, "-c",
                                             "print('starting'); import no_such_module_for_diag"])
    out, err = done.communicate(timeout=60)
    assert done.returncode == 4         # the command's own 1 is in the line below
    lines = err.splitlines()
    said = [i for i, line in enumerate(lines) if line.startswith("diag: the command failed")]
    assert len(said) == 1, err
    assert lines[said[0]] == (f"diag: the command failed at start-up: it exited 1 before any rank "
                              f"or driver started (no probe file in {tmp_path / 'run'}); its last lines:")
    assert lines[said[0] + 1] == "  | starting"
    assert lines[-2] == "  | ModuleNotFoundError: No module named 'no_such_module_for_diag'"
    assert "no hang, death or straggler found" not in out + err
