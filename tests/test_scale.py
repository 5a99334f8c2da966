"""diag at 16,384 ranks (tp=8 x pp=2048): `diag synth` writes the run dir, `diag
analyze` reads it back and names the planted culprit, a rank of a late stage,
alone. How long each takes is benchmarks/scale.py's (--sizes); here only that
the verdict is right. With ops of a fixed length the synthetic pipeline's last
stages began the hung step after the snapshot, and each of 9,336 ranks was
named never_reached."""
import json
import pathlib
import tempfile

import pytest

from helpers.run import diag

pytestmark = pytest.mark.e2e

RANKS, CULPRIT = 16384, 12000


def test_diag_analyze_names_the_culprit_of_16384_ranks():
    with tempfile.TemporaryDirectory(prefix="diag-scale-") as work:
        check_ranks(pathlib.Path(work) / "run")


def check_ranks(run: pathlib.Path) -> None:
    """Outside pytest's tmp_path: a run of minutes outlives the basetemp that
    other pytest sessions of the same user rotate away."""
    made = diag("synth", run, "--ranks", RANKS, "--culprit", CULPRIT, timeout=600)
    assert made.returncode == 0, made.stderr
    assert len(list(run.glob("rank-*.probe"))) == RANKS
    result = diag("analyze", run, "--json", timeout=600)
    assert result.returncode == 1, result.stderr
    verdicts = json.loads(result.stdout)["verdicts"]
    assert [(verdict["kind"], verdict["culprit_ranks"]) for verdict in verdicts] \
        == [("never_reached", [CULPRIT])]
    assert len(verdicts[0]["victim_ranks"]) == RANKS - 1
