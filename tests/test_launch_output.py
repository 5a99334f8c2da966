"""What `diag launch` tells people, through pipes as in CI: the command's output
as it comes, each verdict once, a command that fails before any rank started
said to have failed (with its exit code and last lines), and ranks that ended
normally as exited, not dead."""
import json
import os
import signal
import subprocess
import sys
import time

from test_generic import PROGRAMS, REPO, left_behind

TWO_RANKS = [sys.executable, os.path.join(PROGRAMS, "two_ranks.py")]


def launch(run_dir, *command: str, options=()) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "diagnose.cli", "launch", "--run-dir", str(run_dir),
                             *options, "--", *command], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_ranks_that_end_normally_are_exited_in_the_summary_and_the_report(tmp_path):
    done = launch(tmp_path / "run", *TWO_RANKS, "clean")
    out, err = done.communicate(timeout=60)
    assert done.returncode == 0, err
    assert "rank 0: 5 steps done" in err and "rank 1: 5 steps done" in err  # the output, as it came
    rows = [[cell.strip() for cell in line.split("│")] for line in out.splitlines() if line[:1].isdigit()]
    assert [(row[0], row[2]) for row in rows] == [("0", "exited"), ("1", "exited")], out
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert [row["state"] for row in report["ranks"]] == ["exited", "exited"]


def test_a_hang_is_printed_once_however_long_it_lasts(tmp_path):
    run_dir = tmp_path / "run"
    diag = launch(run_dir, *TWO_RANKS, "hang", options=("--on-hang", "report", "--stall-timeout", "0.5"))
    try:
        deadline = time.monotonic() + 30
        while not (run_dir / "report.json").exists():   # written at the hang, with its dumps
            assert time.monotonic() < deadline and diag.poll() is None
            time.sleep(0.1)
        time.sleep(3.0)        # three more seconds of the same hang: "for 4 s", "for 5 s", ...
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
    done = launch(tmp_path / "run", sys.executable, "-c",
                  "print('starting'); import no_such_module_for_diag")
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
