"""The adversarial fuzzer of tests/test_fuzz_analyze.py, run for as long as asked:
damaged run dirs, Flight Recorder dumps (pickle bombs, groups of 100,000 ranks)
and logs through `diag analyze` and `diag logs`. A case fails on a traceback, on
no answer within 30 s, or on an exit code other than 0, 1 or 2.

    PYTHONPATH=. python benchmarks/fuzz.py --seconds 600 [--seed 7]
        [--json benchmarks/results/fuzz.json]

Prints the cases run and any failure; writes them as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from helpers.fuzz_inputs import fuzz  # noqa: E402 - the test's own loop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--json", default=os.path.join("benchmarks", "results", "fuzz.json"))
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="diag-fuzz-")
    start = time.monotonic()
    try:
        cases, failures = fuzz(args.seconds, args.seed, work)
    finally:
        shutil.rmtree(work)
    wall = time.monotonic() - start
    print(f"seed {args.seed}: {cases} cases in {wall:.0f} s, {len(failures)} failures")
    for failure in failures:
        print(failure)
    with open(args.json, "w") as sink:
        json.dump({"seed": args.seed, "seconds": args.seconds, "wall_s": wall, "cases": cases,
                   "failures": failures, "python": platform.python_version(),
                   "cpus": os.cpu_count(), "load_average": os.getloadavg()}, sink, indent=2)
    print(f"wrote {args.json}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
