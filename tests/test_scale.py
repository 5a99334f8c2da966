"""diag at 16,384 ranks (tp=8 x pp=2048): `diag synth` writes the run dir, `diag
analyze` reads it back and names the planted culprit. How long each takes is
benchmarks/scale.py's (--sizes); here only that the verdict is right."""
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e

RANKS, CULPRIT = 16384, 9000


def diag(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "diagnose.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def test_diag_analyze_names_the_culprit_of_16384_ranks(tmp_path):
    run = tmp_path / "run"
    made = diag("synth", run, "--ranks", RANKS, "--culprit", CULPRIT)
    assert made.returncode == 0, made.stderr
    assert len(list(run.glob("rank-*.probe"))) == RANKS
    result = diag("analyze", run, "--json")
    assert result.returncode == 1, result.stderr
    verdicts = json.loads(result.stdout)["verdicts"]
    assert [(verdict["kind"], verdict["culprit_ranks"]) for verdict in verdicts] \
        == [("never_reached", [CULPRIT])]
    assert len(verdicts[0]["victim_ranks"]) == RANKS - 1
