"""Checks over the whole session."""
import os

import pytest

RUNS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runs")


@pytest.fixture(scope="session", autouse=True)
def no_runs_dir_in_the_checkout():
    """diag launch's default run dir is runs/<time> in the working directory: a
    test that launches must give a --run-dir under its tmp_path instead."""
    existed = os.path.exists(RUNS)
    yield
    assert existed or not os.path.exists(RUNS), f"a test left {RUNS}: give it a --run-dir in tmp_path"
