"""diag's own processes tune the cyclic GC for heaps of thousands of ranks; a
user's rank, which imports only the probe, keeps Python's."""
import gc
import subprocess
import sys

import pytest

from diagnose.core.heap import (MIDDLE_PER_FULL, YOUNG_OBJECTS, YOUNG_PER_MIDDLE, gc_paused)

pytestmark = pytest.mark.unit


def _thresholds_after(code: str) -> tuple:
    done = subprocess.run([sys.executable, "-c", f"import gc\n{code}\nprint(gc.get_threshold())"],
                          capture_output=True, text=True, timeout=60, check=True)
    return eval(done.stdout.splitlines()[-1])


def test_diag_tunes_its_own_process():
    tuned = _thresholds_after("from diagnose.cli import main\nmain([])")
    assert tuned == (YOUNG_OBJECTS, YOUNG_PER_MIDDLE, MIDDLE_PER_FULL)


def test_a_rank_that_imports_the_probe_keeps_pythons_thresholds():
    default = _thresholds_after("pass")
    assert _thresholds_after("import diagnose.probe") == default != (
        YOUNG_OBJECTS, YOUNG_PER_MIDDLE, MIDDLE_PER_FULL)


def test_a_long_running_pause_freezes_nothing_and_collects_again():
    gc.enable()           # an earlier test's library may have left it off (torch's FR analyzer)
    frozen = gc.get_freeze_count()
    with gc_paused(freeze=False):
        assert not gc.isenabled()
        made = [[index] for index in range(1000)]
    assert gc.isenabled() and gc.get_freeze_count() == frozen
    del made


def test_a_pause_for_a_short_process_freezes_what_it_made():
    gc.enable()
    frozen = gc.get_freeze_count()
    try:
        with gc_paused():
            made = [[index] for index in range(1000)]
        assert gc.isenabled() and gc.get_freeze_count() >= frozen + 1000
    finally:
        gc.unfreeze()
    del made
