"""What killed the job: diag launch around a process that dies of an exception
names the exception in its report and on stderr, as `diag logs` reads it from
the job's output, not only that a process died; an exception raised in
hangscope's own probe is said to be ours first."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers.run import launch

pytestmark = pytest.mark.e2e



def launch_script(tmp_path: Path, program: str) -> tuple[subprocess.CompletedProcess, dict]:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(program))
    done, report, _ = launch(tmp_path, [sys.executable, str(script)], on_hang=None)
    return done, report


def test_the_exception_that_ended_the_job_is_named(tmp_path):
    done, report = launch_script(tmp_path, """\
        def load(path):
            raise FileNotFoundError(f"no weights at {path}")

        load("/models/none")
        """)
    found = report["first_failure"]
    assert "FileNotFoundError at job.py:2 load" in found["summary"]
    assert "no weights at /models/none" in found["summary"]
    assert "hangscope" not in found["summary"]
    assert "the job's first failure, from its output (line" in done.stderr
    assert "FileNotFoundError at job.py:2 load" in done.stderr


def test_an_exception_raised_in_hangscopes_probe_says_so_first(tmp_path):
    """probe.init for a worker with no rank raises: a real traceback through the probe."""
    done, report = launch_script(tmp_path, """\
        import os
        os.environ.pop("RANK", None)
        from diagnose import probe
        probe.init("worker")
        """)
    summary = report["first_failure"]["summary"]
    process, said = summary.split(": ", 1)            # who printed it, then what it says
    assert said.startswith("in hangscope's own code (probe/__init__.py:"), summary
    assert "ValueError" in summary and "needs a rank" in summary


def test_a_healthy_job_has_no_first_failure(tmp_path):
    done, report = launch_script(tmp_path, "print('fine')\n")
    assert done.returncode == 0, done.stderr
    assert "first_failure" not in report and "first failure" not in done.stderr
