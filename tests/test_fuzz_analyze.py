"""Fuzzing `diag analyze` and `diag logs` with damaged copies of real input: the
recorded run dirs (tests/fixtures/runs), real Flight Recorder dumps
(tests/fixtures/fr_*) and real logs (tests/fixtures/logs), each mutated by byte
flips, truncations, values swapped in their JSON or pickles, deleted files,
pickles that ask for gigabytes (a memo index, a length), process groups of
100,000 ranks, and escape sequences and long lines in logs. Whatever the
damage: no traceback, no hang, and exit 0, 1 or 2.

    DIAG_FUZZ_S=600 DIAG_FUZZ_SEED=7 pytest tests/test_fuzz_analyze.py
    python benchmarks/fuzz.py --seconds 600      # the same, with a results JSON

runs for DIAG_FUZZ_S seconds (default 5) from seed DIAG_FUZZ_SEED (default
SEED: CI runs the same cases each time; any failure prints its seed). The cases run in one worker process,
which the test replaces when a case outlasts CASE_TIMEOUT_S; `diag analyze`'s
main() runs there as on the command line, so an exception it lets out is a
failure here whatever a caller above it would make of it.
"""
import os

from helpers.fuzz_inputs import SEED, fuzz


def test_damaged_input_never_gives_a_traceback_a_hang_or_another_exit_code(tmp_path):
    seconds = float(os.environ.get("DIAG_FUZZ_S", "5"))
    seed = int(os.environ.get("DIAG_FUZZ_SEED", SEED))
    cases, failures = fuzz(seconds, seed, str(tmp_path))
    assert not failures, f"seed {seed}, {cases} cases:\n" + "\n".join(failures)
