"""False alarms with held-back rings: a real head and agents on loopback
(diagnose/offline/synth_live.py) whose agents save up 8 ring items a report
(`ring_items`), one moving rank's rings every few reports, run after run: healthy runs must end with no verdict,
and runs with a planted hang with its culprit alone.

    PYTHONPATH=. python benchmarks/held_rings_stress.py [--runs 4] [--healthy-s 20]
        [--json benchmarks/results/held_rings_stress.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from helpers.run import free_port  # noqa: E402

from diagnose.offline.synth_live import Plan, launch  # noqa: E402

CULPRIT = 21


def one_run(hang: bool, healthy_s: float, ring_items: int) -> dict:
    plan = Plan(nodes=3, ranks_per_node=16, tp=4, culprit=CULPRIT, kind="never_reached",
                t0=time.time() + 4.0, step_s=0.3, hang_step=int(healthy_s / 0.3) if hang else 10**6,
                ring_items=ring_items)
    with tempfile.TemporaryDirectory(prefix="held-stress-") as work:
        report = os.path.join(work, "report.json")
        flags = ("--on-hang", "kill", "-o", report) if hang else ("-o", report)
        job = launch(plan, work, free_port(), flags)
        try:
            if hang:
                job.head.wait(healthy_s + 60)
            else:
                time.sleep(plan.t0 - time.time() + healthy_s)
        finally:
            job.stop(wait_s=30)
        with open(report) as f:
            verdicts = json.load(f)["verdicts"]
    found = [(verdict["kind"], verdict["culprit_ranks"]) for verdict in verdicts]
    right = found == ([("never_reached", [CULPRIT])] if hang else [])
    return {"hang": hang, "verdicts": found, "right": right}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4, help="of each: healthy, hung")
    parser.add_argument("--healthy-s", type=float, default=20.0)
    parser.add_argument("--ring-items", type=int, default=8)
    parser.add_argument("--json", default="benchmarks/results/held_rings_stress.json")
    args = parser.parse_args()
    os.environ.setdefault("DIAG_NODE_TOKEN", "held-rings-stress")
    runs = [one_run(hang, args.healthy_s, args.ring_items)
            for _ in range(args.runs) for hang in (False, True)]
    print("| runs | healthy: no verdict | hung: the culprit alone |\n|---|---|---|")
    healthy = [run for run in runs if not run["hang"]]
    hung = [run for run in runs if run["hang"]]
    print(f"| {len(runs)} | {sum(r['right'] for r in healthy)} of {len(healthy)} | "
          f"{sum(r['right'] for r in hung)} of {len(hung)} |")
    with open(args.json, "w") as f:
        json.dump({"healthy_s": args.healthy_s, "ring_items": args.ring_items, "runs": runs}, f,
                  indent=1)
    print(f"wrote {args.json}")
    sys.exit(0 if all(run["right"] for run in runs) else 1)


if __name__ == "__main__":
    main()
