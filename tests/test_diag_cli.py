"""Bad input to diag launch, dump and demo: one line on stderr, a non-zero exit,
never a traceback, and nothing started."""
import subprocess
import sys

import pytest


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
    (["launch", "--on-hang", "panic", "--", "true"], "invalid choice"),
    (["launch", "--", "/no/such/program"], "cannot run"),
    (["dump", "/no/such/run"], "no such file or directory"),
    (["tui", "/no/such/run"], "/no/such/run"),
    (["demo", "--bogus"], "unrecognized arguments"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_input_is_one_line(tmp_path, argv, says):
    done = diag(*[a.replace("RUN", str(tmp_path)) for a in argv])
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_launch_passes_the_command_exit_code_through(tmp_path):
    done = diag("launch", "--run-dir", str(tmp_path / "run"), "--", sys.executable, "-c",
                "import sys; sys.exit(7)")
    assert done.returncode == 7
    assert (tmp_path / "run" / "report.json").exists()
