"""`diag analyze --json` of the same directories by two source trees, side by side:
rounds alternate the trees, each run a fresh process; wall time, CPU time and
peak RSS of each, whether every run named the same verdicts, and the
ratio before / now as the headline.

    python benchmarks/analyze_ab.py --before TREE DIR [DIR ...] [--rounds 3] \
        [--json benchmarks/results/analyze_ab.json]

TREE is an older checkout of this repository, e.g. from
`git worktree add /tmp/before REV` or `git archive REV | tar -x -C /tmp/before`;
"now" is the tree this script is in. DIR: a run dir or dumps diag analyze reads
(`diag synth` writes both kinds at any size).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from fr_vs_torchfrtrace import measure as measure_child

NOW = str(Path(__file__).resolve().parents[1])
TIMEOUT_S = 1800.0


@dataclass
class Run:
    tree: str            # "before" or "now"
    dir: str
    round: int
    exit_code: int
    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    verdicts: list       # [kind, culprit ranks] of each verdict it printed


def analyze_once(tree: str, path: str) -> tuple[int, float, float, float, list]:
    """(exit code, wall s, CPU s, peak RSS MB, verdicts) of one `diag analyze --json`
    run by the source tree `tree`."""
    output, wall, cpu, rss, code = measure_child(
        [sys.executable, "-m", "diagnose.cli", "analyze", path, "--json"], TIMEOUT_S, cwd=tree,
        env=dict(os.environ, PYTHONPATH=tree))
    if wall is None:
        sys.exit(f"diag analyze {path} ran past {TIMEOUT_S:g} s in {tree}")
    verdicts = [[verdict["kind"], verdict["culprit_ranks"]]
                for verdict in json.loads(output)["verdicts"]]
    return code, wall, cpu, rss, verdicts


def measure(before: str, dirs: list[str], rounds: int) -> list[Run]:
    runs = []
    for index in range(rounds):
        order = [("before", before), ("now", NOW)]
        if index % 2:
            order.reverse()
        for path in dirs:
            for name, tree in order:
                code, wall, cpu, rss, verdicts = analyze_once(tree, path)
                runs.append(Run(name, path, index, code, wall, cpu, rss, verdicts))
                print(f"round {index + 1} {name:<6} {path}: exit {code}, {wall:.2f} s, "
                      f"{cpu:.2f} s CPU, {rss:.0f} MB", flush=True)
    return runs


def summary(runs: list[Run], path: str) -> dict:
    def median(tree: str, field: str) -> float:
        return statistics.median(getattr(r, field) for r in runs if r.tree == tree and r.dir == path)
    verdicts = {json.dumps(r.verdicts) for r in runs if r.dir == path}
    codes = {r.exit_code for r in runs if r.dir == path}
    row = {"dir": path, "same_verdicts": len(verdicts) == 1, "exit_codes": sorted(codes),
           "verdicts": json.loads(min(verdicts))}
    for field in ("wall_s", "cpu_s", "peak_rss_mb"):
        row[f"before_{field}"], row[f"now_{field}"] = median("before", field), median("now", field)
    row["wall_ratio"] = row["before_wall_s"] / row["now_wall_s"]
    row["cpu_ratio"] = row["before_cpu_s"] / row["now_cpu_s"]
    return row


def print_table(rows: list[dict]) -> None:
    print("| dir | before: wall, CPU, RSS | now: wall, CPU, RSS | before / now (wall, CPU) "
          "| same verdicts |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['dir']} | {row['before_wall_s']:.2f} s, {row['before_cpu_s']:.2f} s, "
              f"{row['before_peak_rss_mb']:.0f} MB | {row['now_wall_s']:.2f} s, "
              f"{row['now_cpu_s']:.2f} s, {row['now_peak_rss_mb']:.0f} MB | "
              f"{row['wall_ratio']:.2f}x, {row['cpu_ratio']:.2f}x | "
              f"{'yes' if row['same_verdicts'] else 'no'} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="an older checkout of this repository")
    parser.add_argument("dirs", nargs="+", help="what diag analyze reads")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default="benchmarks/results/analyze_ab.json")
    args = parser.parse_args()
    if not os.path.isfile(os.path.join(args.before, "diagnose", "cli", "__init__.py")):
        parser.error(f"--before {args.before}: no diagnose/cli/__init__.py there")
    runs = measure(os.path.abspath(args.before), [os.path.abspath(d) for d in args.dirs],
                   args.rounds)
    rows = [summary(runs, os.path.abspath(d)) for d in args.dirs]
    print_table(rows)
    with open(args.json, "w") as sink:
        json.dump({"machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
                              f"{platform.python_version()}",
                   "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   "command": " ".join(sys.argv), "rows": rows,
                   "runs": [asdict(run) for run in runs]}, sink, indent=1)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
