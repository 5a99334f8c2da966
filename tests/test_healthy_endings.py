"""A healthy command's end is no death: `diag launch --on-hang kill` must not end
a run whose driver exits 0 while the command itself has not ended yet (a
shell around it, or the kernel tearing the process down). The race behind
"[dead] the driver died 1 s ago (process gone, exit code unknown)" after a
healthy `python -m engine bench`, pinned with tests/programs/ending.py."""
import os
import sys

from helpers.run import PROGRAMS, launch

ENDING = os.path.join(PROGRAMS, "ending.py")


def test_a_driver_that_ends_before_the_shell_around_it_is_no_death(tmp_path):
    done, report, _ = launch(tmp_path, ["sh", "-c", f"{sys.executable} {ENDING} clean; sleep 2"])
    assert done.returncode == 0, done.stderr
    assert report["verdicts"] == []


def test_a_driver_whose_process_lingers_after_its_main_thread_is_no_death(tmp_path):
    done, report, _ = launch(tmp_path, [sys.executable, ENDING, "zombie"])
    assert done.returncode == 0, done.stderr
    assert report["verdicts"] == [] and report["command_exit"] == 0


def test_a_driver_that_raises_before_the_shell_around_it_ends_is_a_death(tmp_path):
    done, report, _ = launch(tmp_path, ["sh", "-c", f"{sys.executable} {ENDING} raise; sleep 5"])
    assert done.returncode == 4, done.stderr            # the job crashed: a death, no hang
    assert [v["kind"] for v in report["verdicts"]] == ["dead"]
    assert "the driver died" in report["verdicts"][0]["summary"]


def test_a_driver_that_exits_3_is_judged_with_its_exit_code(tmp_path):
    done, report, _ = launch(tmp_path, [sys.executable, ENDING, "fail"])
    assert done.returncode == 4, done.stderr            # not 3, diag's own failure
    assert report["command_exit"] == 3 and "diag: the command exited 3" in done.stderr
    assert [v["kind"] for v in report["verdicts"]] == ["dead"]
    assert report["verdicts"][0]["evidence"]["exitcode"] == 3
