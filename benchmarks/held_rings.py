"""What one node's reports cost the head while its ranks step, with every ring
change sent against moving ranks' rings held back past a report's ring items
(diagnose/launch/node_delta.py), side by side in one process, rounds alternating.

    PYTHONPATH=. python benchmarks/held_rings.py [--ranks-per-node 1024] [--history 64]
        [--healthy-s 10] [--rounds 3] [--json benchmarks/results/held_rings.json]

Each arm plays one node of synthetic ranks (diagnose/offline/synth_live.py: tp=8,
a step every 0.5 s, HISTORY phases and records kept per rank, the probe's rings
holding 64) through a real ReportWriter and the head's Known, a report every
launcher poll: HEALTHY_S of steps, then the planted hang and 3 s after it. It
times in CPU seconds the agent making each healthy report and the head decoding
and applying it, and counts its bytes; the head's share of a core for 16 such
nodes is 16 x (reports a second) x the head's time a report. It also gives how
long a moving rank's rings waited at most, and after the hang, the report at
which the head held every rank as the agent does, and that report's cost.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from diagnose.core.groups import GroupReader  # noqa: E402
from diagnose.core.heap import tune_for_large_heaps  # noqa: E402
from diagnose.launch import nodes  # noqa: E402
from diagnose.launch.launcher import POLL_S  # noqa: E402
from diagnose.launch.node_delta import Known, ReportWriter, node_share  # noqa: E402
from diagnose.offline.synth_live import NodeRanks, Plan  # noqa: E402

NODES = 16
ARMS = {"every change": None, "held back": node_share(NODES)}


def arm(ring_items: int | None, ranks_per_node: int, history: int, healthy_s: float) -> dict:
    plan = Plan(nodes=2, ranks_per_node=ranks_per_node, tp=8, culprit=ranks_per_node + 1,
                kind="never_reached", t0=1000.0, step_s=0.5,
                hang_step=int(healthy_s / 0.5) + 4, history=history)
    synth, writer, groups = NodeRanks(plan, node_rank=2), ReportWriter(ring_items), GroupReader()
    known, now = None, plan.sent_at(2)
    healthy = {"agent_s": [], "head_s": [], "bytes": []}
    sent_at: dict[int, float] = {}          # rank -> when the head last got its rings whole
    longest_wait, caught_up = 0.0, None
    while now < plan.hang_at + 3.0:
        ranks = synth.snapshot(now).ranks
        cpu = time.process_time()
        body = nodes.JSON.encode(writer.report(ranks, now))
        agent_s = time.process_time() - cpu
        cpu = time.process_time()
        known = Known.read(nodes.JSON.decode(body), known, groups)
        head_s = time.process_time() - cpu
        writer.applied(known.seq)
        for rank, state in known.states.items():
            if state.progress_at is None:
                sent_at[rank] = now
        longest_wait = max(longest_wait, max(now - at for at in sent_at.values()))
        if plan.sent_at(4) <= now < plan.sent_at(plan.hang_step):
            for name, value in (("agent_s", agent_s), ("head_s", head_s), ("bytes", len(body))):
                healthy[name].append(value)
        elif now >= plan.hang_at and caught_up is None and _same(known, ranks):
            caught_up = {"after_hang_s": now - plan.hang_at, "head_s": head_s,
                         "bytes": len(body)}
        now += POLL_S
    head_s = statistics.mean(healthy["head_s"])
    return {"ring_items": ring_items, "reports": len(healthy["head_s"]),
            "agent_s_per_report": statistics.mean(healthy["agent_s"]),
            "head_s_per_report": head_s, "kb_per_report": statistics.mean(healthy["bytes"]) / 1e3,
            "head_cores_for_16_nodes": NODES * head_s / POLL_S,
            "longest_ring_wait_s": longest_wait, "caught_up_after_hang": caught_up}


def _same(known: Known, ranks: dict) -> bool:
    return {rank: asdict(state) for rank, state in known.states.items()} == \
        {rank: asdict(state) for rank, state in ranks.items()}


def table(result: dict) -> str:
    by_arm = {name: [run for run in result["runs"] if run["arm"] == name] for name in ARMS}

    def median(name: str, key: str) -> float:
        return statistics.median(run[key] for run in by_arm[name])

    rows = [("the head, CPU a report", "head_s_per_report", "{:.4f} s"),
            ("the agent, CPU a report", "agent_s_per_report", "{:.4f} s"),
            ("a report's size", "kb_per_report", "{:.0f} kB"),
            ("the head's cores for 16 such nodes", "head_cores_for_16_nodes", "{:.2f}"),
            ("a moving rank's rings waited, at most", "longest_ring_wait_s", "{:.2f} s")]
    before, after = ARMS
    lines = [f"| {result['ranks_per_node']} ranks, {result['history']} kept, medians of "
             f"{result['rounds']} | {before} | {after} | ratio |", "|---|---|---|---|"]
    for label, key, form in rows:
        a, b = median(before, key), median(after, key)
        ratio = f"{a / b:.1f}x" if a and b else "-"
        lines.append(f"| {label} | {form.format(a)} | {form.format(b)} | {ratio} |")
    caught = [run["caught_up_after_hang"] for run in by_arm[after]]
    lines.append("| the head holds every rank as its agent, after the hang | "
                 + " | ".join(", ".join("never" if c is None else f"{c['after_hang_s']:.2f} s"
                                        for c in [run["caught_up_after_hang"]
                                                  for run in by_arm[name]]) for name in ARMS)
                 + " | - |")
    worst = max((c["head_s"] for c in caught if c is not None), default=float("nan"))
    lines.append(f"| held back: the head's CPU for that report, at most | - | {worst:.3f} s | - |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks-per-node", type=int, default=1024)
    parser.add_argument("--history", type=int, default=64)
    parser.add_argument("--healthy-s", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default="benchmarks/results/held_rings.json")
    args = parser.parse_args()
    tune_for_large_heaps()                    # as the head's process has them
    runs = [dict(arm(items, args.ranks_per_node, args.history, args.healthy_s), arm=name)
            for _ in range(args.rounds) for name, items in ARMS.items()]
    result = {"ranks_per_node": args.ranks_per_node, "history": args.history,
              "healthy_s": args.healthy_s, "rounds": args.rounds, "runs": runs,
              "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                         f"Python {platform.python_version()}", "load": os.getloadavg()}
    print(table(result))
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
