"""PyTorch's own Flight Recorder analyzer tests as a peer suite: the cases of
test_fr_analysis.py written as dump files (tests/fixtures/fr_peer, made by
tests/fixtures/make_fr_peer_suite.py); `diag analyze` must pass or fail each as
torch's analyzer does, and the torch installed here is asked too."""
import filecmp
import importlib.util
import os

import pytest

from diagnose.launch.rundir import open_run

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "fixtures", "make_fr_peer_suite.py")


def _suite():
    spec = importlib.util.spec_from_file_location("make_fr_peer_suite", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SUITE = _suite()
CASES = {case.name: case for case in SUITE.all_cases()}


def diag_passes(directory: str) -> bool:
    """What `diag analyze DIRECTORY` concludes: exit 0 (healthy) or 1 (verdicts)."""
    source = open_run(directory)
    assert source.notes == []
    return source.verdicts(source.snapshot()) == []


@pytest.mark.parametrize("name", sorted(CASES))
def test_diag_passes_or_fails_each_case_as_torch_does(name):
    case = CASES[name]
    expected = case.torch_passes if not case.diag_differs else not case.torch_passes
    assert diag_passes(os.path.join(SUITE.OUT, name)) == expected, case.diag_differs


def test_the_installed_torch_analyzer_agrees_with_the_cases():
    pytest.importorskip("torch.distributed.flight_recorder.components.builder")
    verdicts = {name: SUITE.torch_verdict(os.path.join(SUITE.OUT, name)) for name in CASES}
    assert verdicts == {name: case.torch_passes for name, case in CASES.items()}


def test_the_committed_dumps_are_what_the_script_writes(tmp_path):
    SUITE.write(SUITE.all_cases(), str(tmp_path))
    for name in CASES:
        compared = filecmp.dircmp(os.path.join(SUITE.OUT, name), tmp_path / name)
        assert compared.left_only == compared.right_only == compared.diff_files == [], name
