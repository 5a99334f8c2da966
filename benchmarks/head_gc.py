"""The cyclic GC's share of a head's work at 16,384 ranks: as before diag tuned
it (Python's default thresholds, nothing paused) against now (diagnose/core/heap.py:
diag's thresholds, the GC paused through an analysis and a node file's decoding),
side by side, each arm in a fresh process, rounds alternating.

    PYTHONPATH=. python benchmarks/head_gc.py [--nodes 16] [--ranks-per-node 1024]
        [--steps 6] [--rounds 3] [--json benchmarks/results/head_gc.json]

Each arm holds NODES nodes of synthetic ranks (diagnose/offline/synth_live.py,
stepping every 0.5 s) as the head does (node_delta.Known), then times, in CPU
seconds: applying STEPS healthy steps' reports of every node in turn (decoded
from the JSON their agents sent), one poll's merge and analysis of the job, and
`diag tui` reading the head's node files for the first time; and how many full
collections ran, and their time, while the reports were applied.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from helpers.run import free_port  # noqa: E402

import diagnose.analysis  # noqa: E402
from diagnose.analysis import analyze  # noqa: E402
from diagnose.core.groups import GroupReader  # noqa: E402
from diagnose.core.heap import tune_for_large_heaps  # noqa: E402
from diagnose.core.snapshot import Snapshot  # noqa: E402
from diagnose.launch import nodes  # noqa: E402
from diagnose.launch.node_delta import Known, ReportWriter  # noqa: E402
from diagnose.offline.synth_live import NodeRanks, Plan  # noqa: E402

ARMS = ("before", "now")
STEP_S = 0.5


class Collections:
    """The full collections that run, and the seconds they take, while counting."""

    def __init__(self):
        self.count, self.seconds, self._began = 0, 0.0, 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.count += 1
            self.seconds += time.perf_counter() - self._began


def arm(name: str, node_count: int, ranks_per_node: int, steps: int) -> dict:
    """One arm, in this process: its GC thresholds, then the head's passes."""
    if name == "now":
        tune_for_large_heaps()
    else:                      # the code before: the GC ran through both
        diagnose.analysis.gc_paused = nodes.gc_paused = _not_paused
    plan = Plan(nodes=node_count, ranks_per_node=ranks_per_node, tp=8, culprit=1,
                kind="never_reached", t0=1000.0, step_s=STEP_S, hang_step=10 ** 6, history=16)
    began = plan.sent_at(8)
    agents = [(NodeRanks(plan, node), ReportWriter(ring_items=None)) for node in range(1, node_count + 1)]
    sent = [[_report(ranks, writer, began + step * STEP_S) for ranks, writer in agents]
            for step in range(steps + 1)]
    groups = GroupReader()
    known = [Known.read(nodes.JSON.decode(body), None, groups) for body in sent[0]]
    full = Collections()
    gc.callbacks.append(full)
    cpu = time.process_time()
    for bodies in sent[1:]:
        for node, body in enumerate(bodies):
            known[node] = Known.read(nodes.JSON.decode(body), known[node], groups)
    apply_s = (time.process_time() - cpu) / (steps * node_count)
    gc.callbacks.remove(full)
    now = began + steps * STEP_S
    with tempfile.TemporaryDirectory(prefix="head-gc-") as run_dir:
        hub = nodes.NodeHub(f"127.0.0.1:{free_port()}", b"head-gc-key", run_dir, node_count + 1)
        try:
            for node, state in enumerate(known, start=1):
                hub.reports[node].received_at, hub.reports[node].connected = now, True
                hub.known[node] = state
            hub.save_all()
            cpu = time.process_time()
            snapshot = nodes.merge(Snapshot(taken_at=now, run_dir=run_dir, ranks={}),
                                   hub.nodes(), [])
            verdicts = analyze(replace(snapshot))
            poll_s = time.process_time() - cpu
        finally:
            hub.close()
        cpu = time.process_time()
        nodes.NodeFiles().read(run_dir)
        files_s = time.process_time() - cpu
    return {"arm": name, "thresholds": gc.get_threshold(), "apply_s": apply_s,
            "full_collections": full.count, "full_collection_s": full.seconds,
            "poll_s": poll_s, "files_read_s": files_s, "verdicts": len(verdicts)}


def _not_paused(freeze: bool = True):
    return contextlib.nullcontext()


def _report(ranks: NodeRanks, writer: ReportWriter, now: float) -> bytes:
    body = nodes.JSON.encode(writer.report(ranks.snapshot(now).ranks, now))
    writer.applied(writer.seq)
    return body


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--ranks-per-node", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)   # one arm, in a child
    parser.add_argument("--json", default="benchmarks/results/head_gc.json")
    args = parser.parse_args()
    if args.arm:
        print(json.dumps(arm(args.arm, args.nodes, args.ranks_per_node, args.steps)))
        return
    runs = [_child(name, args) for _ in range(args.rounds) for name in ARMS]
    result = {"nodes": args.nodes, "ranks_per_node": args.ranks_per_node, "steps": args.steps,
              "runs": runs, "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                                      f"Python {platform.python_version()}",
              "load": os.getloadavg()}
    print(table(result))
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.json}")


def _child(name: str, args) -> dict:
    command = [sys.executable, __file__, "--arm", name, "--nodes", str(args.nodes),
               "--ranks-per-node", str(args.ranks_per_node), "--steps", str(args.steps)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    run = json.loads(done.stdout.splitlines()[-1])
    print(f"  {name}: {run}", flush=True)
    return run


def table(result: dict) -> str:
    def median(name: str, key: str) -> float:
        return statistics.median(run[key] for run in result["runs"] if run["arm"] == name)
    rows = [("a node's healthy report applied, CPU s", "apply_s"),
            ("full collections while applying", "full_collections"),
            ("their seconds", "full_collection_s"),
            ("a poll: merge and analysis, CPU s", "poll_s"),
            ("diag tui's first read of the node files, CPU s", "files_read_s")]
    lines = [f"{result['nodes']} x {result['ranks_per_node']} ranks, {result['machine']}, "
             f"medians of {len(result['runs']) // 2} rounds",
             "| | before | now | before / now |", "|---|---|---|---|"]
    for label, key in rows:
        before, after = median("before", key), median("now", key)
        ratio = f"{before / after:.1f}x" if after else "-"
        lines.append(f"| {label} | {before:.3g} | {after:.3g} | {ratio} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
