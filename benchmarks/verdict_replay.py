"""The head's time to a verdict at scale, replayed in one process: the reports
of NODES synthetic nodes (diagnose/offline/synth_live.py), made ahead, are applied
by a thread per node at the pace the agents send them (one a launcher poll),
through a real NodeHub's `apply` (its workers, where it has them), while the
main thread polls as a head does: the merge of what the hub holds, then the
analysis, in this thread (`inline`, as the head did before judging.py) or in
a forked judge (`fork`, as it does now); both each round. Wall time maps onto
the plan's clock, so the stall limits and the held-back rings act as they do
live (the plan starts far enough ahead that its reports are made before the
first is due); the agents' own work is left out (it is done ahead), so the
head has this machine to itself.

    PYTHONPATH=. python benchmarks/verdict_replay.py [--nodes 16] [--ranks-per-node 1024]
        [--readers N] [--rounds 3] [--json benchmarks/results/verdict_replay.json]

Per round and way: when the poll that first had the culprit named ended, after
the planted hang; the polls from 2 s before the hang to it (when each began,
how long it took); the CPU of this process from the hang to the verdict (its
workers and judges apart: they are reaped children, counted too).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import replace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from helpers.run import free_port  # noqa: E402

from diagnose.analysis import analyze  # noqa: E402
from diagnose.core.heap import tune_for_large_heaps  # noqa: E402
from diagnose.core.snapshot import Snapshot  # noqa: E402
from diagnose.core.workers import cores, pool  # noqa: E402
from diagnose.launch import nodes  # noqa: E402
from diagnose.launch.judging import ForkedJudge  # noqa: E402
from diagnose.launch.launcher import POLL_S  # noqa: E402
from diagnose.launch.node_delta import Known, ReportWriter, node_share  # noqa: E402
from diagnose.offline.synth_live import NodeRanks, Plan, driver_at  # noqa: E402
from live_scale import machine  # noqa: E402

WAYS = ("inline", "fork")
BEFORE_S = 3.0       # healthy reports replayed before the hang
AFTER_S = 12.0       # and after it: the longest wait for a verdict


def made_reports(plan: Plan, node: int) -> tuple[bytes, list[tuple[float, bytes]]]:
    """A node's whole report (as of BEFORE_S + 1 s before the hang) and every report
    after it, one a poll, each with the plan time it is sent at."""
    ranks, writer = NodeRanks(plan, node), ReportWriter(node_share(plan.nodes))
    start = plan.hang_at - BEFORE_S - 1.0

    def report(at: float) -> bytes:
        body = nodes.JSON.encode(writer.report(ranks.snapshot(at).ranks, at))
        writer.applied(writer.pending.seq)
        return body
    whole = report(start)
    times = [start + POLL_S * k for k in range(1, int((BEFORE_S + 1.0 + AFTER_S) / POLL_S))]
    return whole, [(at, report(at)) for at in times]


def replay(plan: Plan, made: dict, readers: int | None, way: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="verdict-replay-") as run_dir:
        hub = nodes.NodeHub(f"127.0.0.1:{free_port()}", b"replay-key", run_dir,
                            plan.nodes + 1, readers=readers)
        judge = ForkedJudge(analyze) if way == "fork" else None
        try:
            for node, (whole, _) in made.items():
                hub.known[node] = Known.read(nodes.JSON.decode(whole), None, hub.groups)
            return _polls(plan, made, hub, judge)
        finally:
            if judge is not None:
                judge.close()
            hub.close()


def _judged(judge: ForkedJudge | None, snapshot: Snapshot, hub: nodes.NodeHub) -> list:
    if judge is None:
        return analyze(snapshot)
    judged = judge.judge(snapshot, hub.news, hub.large_incoming)
    return list(judged.verdicts) if judged else []


def _polls(plan: Plan, made: dict, hub: nodes.NodeHub, judge: ForkedJudge | None) -> dict:
    began = time.time()

    def send(node: int) -> None:
        for at, body in made[node][1]:
            time.sleep(max(0.0, at - time.time()))
            hub.apply(hub.reports[node], body)
    for node in made:
        hub.reports[node].connected = True
        hub.reports[node].received_at = began
    threads = [threading.Thread(target=send, args=(node,), daemon=True) for node in made]
    for thread in threads:
        thread.start()
    polls, verdict, cpu_at_hang = [], None, None
    culprit = f"rank {plan.culprit} "
    while time.time() < plan.hang_at + AFTER_S:
        now = time.time()
        if cpu_at_hang is None and now >= plan.hang_at:
            cpu_at_hang = time.process_time() + _children_cpu()
        head = Snapshot(taken_at=now, run_dir="replay", ranks={}, driver=driver_at(plan, now))
        found = _judged(judge, nodes.merge(head, hub.nodes(), []), hub)
        polls.append((round(now - plan.hang_at, 3), round(time.time() - now, 3)))
        if any(culprit in v.summary for v in found):
            verdict = next(v.summary for v in found if culprit in v.summary)
            break
        time.sleep(POLL_S)
    verdict_s = (time.time() - plan.hang_at) if verdict else None
    cpu = (time.process_time() + _children_cpu() - cpu_at_hang
           if cpu_at_hang is not None else None)
    for thread in threads:
        thread.join(timeout=0)
    after = [took for at, took in polls if at >= -2.0]
    return {"verdict_s": verdict_s, "verdict": verdict, "head_cpu_hang_to_verdict_s": cpu,
            "polls_from_2s_before": polls[-len(after):] if after else [],
            "poll_s_median": statistics.median(took for _, took in polls) if polls else None}


def _children_cpu() -> float:
    """Reaped children's CPU (the judges'; the hub's workers count at its close)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--ranks-per-node", type=int, default=1024)
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--readers", type=int, default=None,
                        help="the hub's worker processes (default: as diag chooses)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default="benchmarks/results/verdict_replay.json")
    args = parser.parse_args()
    tune_for_large_heaps()
    world = args.nodes * args.ranks_per_node
    results = []
    plan = Plan(nodes=args.nodes, ranks_per_node=args.ranks_per_node, tp=args.tp,
                culprit=world * 3 // 4 + 1, kind="never_reached", t0=time.time(), step_s=0.5,
                hang_step=10)
    made_at = time.perf_counter()
    made_reports(plan, 1)
    makers = min(cores(), args.nodes)
    ahead = (time.perf_counter() - made_at) * math.ceil(args.nodes / makers) * 2.0 + 10.0
    for round_ in range(args.rounds):
        for way in WAYS:
            plan = replace(plan, t0=time.time() + ahead)
            with pool(makers) as made_by:
                made = (dict(zip(range(1, args.nodes + 1),
                                 made_by.starmap(made_reports, [(plan, node) for node in
                                                                range(1, args.nodes + 1)])))
                        if made_by else {node: made_reports(plan, node)
                                         for node in range(1, args.nodes + 1)})
            if time.time() > plan.hang_at - BEFORE_S - 1.0:
                sys.exit("the reports took longer to make than planned: run again")
            result = replay(plan, made, args.readers, way) | {"way": way, "round": round_ + 1}
            results.append(result)
            print(f"round {round_ + 1}, {way}: verdict "
                  f"{result['verdict_s'] and round(result['verdict_s'], 2)} s after the hang; "
                  f"CPU {result['head_cpu_hang_to_verdict_s']:.2f} s; polls (start after the "
                  f"hang, seconds) {result['polls_from_2s_before']}")
    out = {"nodes": args.nodes, "ranks_per_node": args.ranks_per_node, "readers": args.readers,
           "machine": machine(), "rounds": results,
           "verdict_s": {way: [r["verdict_s"] for r in results if r["way"] == way]
                         for way in WAYS}}
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
