"""The metrics of one real hang, as Prometheus saw them: our engine at tp=2 pp=2 on
the CPU under `diag launch --metrics-port --on-hang dump,kill:10`, rank 3 hung
before its execute_model of step 300, a real Prometheus scraping every second with
deploy/prometheus/hangscope-alerts.yml (tests/helpers/oncall_run.py runs it). Plots the
series from Prometheus' query_range API and prints how long each signal took.

    python benchmarks/metrics_plot.py [--png docs/images/metrics-hang.png]
                                      [--json benchmarks/results/metrics_plot.json]

Needs the `prometheus` binary (apt-get install prometheus) and matplotlib (the
`plot` extra).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from helpers.oncall_run import REPO, run_hung  # noqa: E402
from helpers.prometheus_server import missing  # noqa: E402

FAULT_RANK, FAULT_STEP, KILL_AFTER_S = 3, 300, 10
BEFORE_S = 20.0     # of the healthy run before the fault, in the plot
STEP_S = 0.5


def series(prometheus, expr: str, start: float, end: float) -> list[dict]:
    return [{"labels": s["metric"] | {"__name__": expr},
             "points": [(float(t), float(v)) for t, v in s["values"]]}
            for s in prometheus.query_range(expr, start, end, STEP_S)]


def _label(s: dict) -> str:
    labels = s["labels"]
    if "culprit_rank" in labels:
        return f"hangscope_hang: {labels['kind']}, culprit rank {labels['culprit_rank']}"
    return f"rank {labels['rank']}" if "rank" in labels else labels["__name__"]


def plot(data: dict, times: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    zero = times["fault_fired_at"]
    fig, axes = plt.subplots(3, 1, figsize=(9, 7), sharex=True)
    panels = [(["hangscope_rank_step"], "step"), (["hangscope_progress_age_seconds"], "seconds"),
              (["hangscope_hung", "hangscope_hang"], "0 / 1")]
    for axis, (names, unit) in zip(axes, panels):
        for s in (s for name in names for s in data[name]):
            xs, ys = zip(*s["points"])
            axis.step([x - zero for x in xs], ys, where="post", label=_label(s))
        axis.set_ylabel(unit)
        axis.set_title(", ".join(names), fontsize=9, loc="left")
        axis.legend(fontsize=7, loc="upper left")
    for name, style in [("first_503_at", "--"), ("alert_firing_seen_at", ":"),
                        ("diag_exited_at", "-.")]:
        if times.get(name):
            for axis in axes:
                axis.axvline(times[name] - zero, color="grey", linestyle=style, linewidth=1)
            axes[1].text(times[name] - zero, axes[1].get_ylim()[1], name.removesuffix("_at"),
                         fontsize=7, rotation=90, va="top", ha="right")
    axes[-1].set_xlabel(f"seconds from the fault (rank {FAULT_RANK} hangs before step "
                        f"{FAULT_STEP}'s execute_model)")
    fig.suptitle("diag launch --metrics-port: engine tp=2 pp=2 (CPU), as Prometheus scraped it",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--png", default=os.path.join(REPO, "docs", "images", "metrics-hang.png"))
    parser.add_argument("--json", default=os.path.join(REPO, "benchmarks", "results",
                                                       "metrics_plot.json"))
    args = parser.parse_args()
    if missing():
        print(f"metrics_plot: {missing()}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as workdir:
        watched = run_hung(workdir, FAULT_RANK, FAULT_STEP, KILL_AFTER_S)
        try:
            times = {"fault_fired_at": watched.fired_at, "first_503_at": watched.first_503,
                     "alert_firing_seen_at": watched.firing[0][0] if watched.firing else None,
                     "diag_exited_at": watched.exited_at, "diag_exit_code": watched.returncode}
            start = max(watched.started_at, times["fault_fired_at"] - BEFORE_S)
            end = watched.exited_at + 3
            data = {name: series(watched.prometheus, name, start, end)
                    for name in ("hangscope_rank_step", "hangscope_progress_age_seconds",
                                 "hangscope_hang", "hangscope_hung")}
        finally:
            watched.prometheus.stop()
    plot(data, times, args.png)
    fired = times["fault_fired_at"]
    result = {"machine": platform.node(), "cpus": os.cpu_count(), "times": times,
              "after_fault_s": {name.removesuffix("_at"): round(value - fired, 2)
                                for name, value in times.items()
                                if name.endswith("_at") and value and name != "fault_fired_at"},
              "series": data}
    with open(args.json, "w") as out:
        json.dump(result, out, indent=1)
    print(f"{'signal':<24} {'s after the fault':>18}")
    for name, seconds in result["after_fault_s"].items():
        print(f"{name:<24} {seconds:>18.2f}")
    print(f"plot: {args.png}\nnumbers: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
