"""Bad input to diag launch, dump and demo: one line on stderr, exit 2, never a
traceback, and nothing started; and diag's own failures: one line, exit 3."""
import subprocess
import sys

import pytest

from diagnose import cli


def diag(*argv: str, timeout: int = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "diagnose.cli", *argv], capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("argv,says", [
    (["launch"], "needs a command after --"),
    (["launch", "--"], "needs a command after --"),
    (["launch", "--fault", "rank=1,at=nowhere,kind=hang", "--", "true"], "unknown phase"),
    (["launch", "--fault", "rank=1,at=forward,kind=explode", "--", "true"], "unknown kind"),
    (["launch", "--launch-blocking", "one", "--", "true"], "ranks like 0,3"),
    (["launch", "--stall-timeout", "-3", "--", "true"], "seconds >= 0"),
    (["launch", "--stall-timeout", "0", "--", "true"], "at least 0.5 s for diag launch"),
    (["launch", "--stall-timeout", "0.2", "--", "true"], "at least 0.5 s for diag launch"),
    (["launch", "--fault", "rank=0,at=forward,kind=sleep:inf", "--", "true"], "finite number"),
    (["launch", "--fault", "rank=0,at=forward,kind=sleep:nan", "--", "true"], "finite number"),
    (["launch", "--run-dir", "/proc/diag-run", "--", "true"], "cannot use run dir /proc/diag-run"),
    (["launch", "--run-dir", "/sys/kernel", "--", "true"], "cannot use run dir /sys/kernel: "),
    (["launch", "--run-dir", "RUN/not-a-dir/run", "--", "true"], "Not a directory"),
    (["launch", "--run-dir", "RUN/run", "--", "RUN/not-executable"], "Permission denied"),
    (["launch", "--on-hang", "panic", "--", "true"], "invalid choice"),
    (["launch", "--run-dir", "RUN/run", "--", "/no/such/program"], "cannot run"),  # not runs/ in the checkout
    (["dump", "/no/such/run"], "no such file or directory"),
    (["tui", "/no/such/run"], "/no/such/run"),
    (["demo", "--bogus"], "unrecognized arguments"),
    (["demo", "--no-tui", "--run-dir", "/proc/diag-demo"], "cannot use run dir /proc/diag-demo"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_input_is_one_line(tmp_path, argv, says):
    (tmp_path / "not-a-dir").write_text("")
    (tmp_path / "not-executable").write_text("#!/bin/sh\necho hi\n")
    done = diag(*[a.replace("RUN", str(tmp_path)) for a in argv])
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_launch_passes_the_command_exit_code_through(tmp_path):
    done = diag("launch", "--run-dir", str(tmp_path / "run"), "--", sys.executable, "-c",
                "import sys; sys.exit(7)")
    assert done.returncode == 7
    assert (tmp_path / "run" / "report.json").exists()


def test_launch_exits_as_a_shell_does_when_a_signal_ends_the_command(tmp_path):
    done = diag("launch", "--run-dir", str(tmp_path / "run"), "--", sys.executable, "-c",
                "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert done.returncode == 128 + 9


def _fails(args):
    raise KeyError("a bug")


def test_a_failure_of_diag_itself_is_one_line_and_exit_3(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(cli, "analyze_command", _fails)
    monkeypatch.delenv(cli.DEBUG_VAR, raising=False)
    assert cli.main(["analyze", str(tmp_path)]) == cli.EXIT_INTERNAL == 3
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("diag: internal error: KeyError: 'a bug'")
    monkeypatch.setenv(cli.DEBUG_VAR, "1")
    assert cli.main(["analyze", str(tmp_path)]) == 3
    assert "Traceback" in capsys.readouterr().err


def test_ctrl_c_outside_a_run_is_one_line_and_exit_130(monkeypatch, capsys, tmp_path):
    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "analyze_command", interrupted)
    assert cli.main(["analyze", str(tmp_path)]) == 130
    assert capsys.readouterr().err.strip().splitlines() == ["diag: interrupted"]
