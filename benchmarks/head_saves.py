"""How long the head's poll waits while its node files are written: a node's
ranks encoded in one json.dumps (as the head did) against one rank at a time
(`nodes.node_text`, now), side by side in one process, rounds alternating.

    PYTHONPATH=. python benchmarks/head_saves.py [--nodes 16] [--ranks-per-node 1024]
        [--rounds 3] [--json benchmarks/results/head_saves.json]

The head writes every node's file at the node's report after its verdicts
change and every 10 s; nodes that connected together come due together. Here
NODES nodes of synthetic ranks (diagnose/offline/synth_live.py), as the head holds
them (node_delta.Known, from a whole report), are encoded one after another by
a thread, as the node threads do under the hub's save lock, while the main
thread stands for the poll: it asks for the interpreter every millisecond and
notes how long each turn took to come. A C call holds the GIL until it returns,
so one json.dumps of a node holds the poll off for all of it.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import threading
import time

from diagnose.core.groups import GroupReader
from diagnose.core.schema import Document, stamped
from diagnose.launch import nodes
from diagnose.launch.node_delta import Known, ReportWriter, node_share
from diagnose.offline.synth_live import NodeRanks, Plan

TICK_S = 0.001


def node_wires(count: int, per_node: int) -> list[dict]:
    """Each node's ranks as the head keeps them for its file (Known.wire)."""
    plan = Plan(nodes=count, ranks_per_node=per_node, tp=8, culprit=count * per_node * 3 // 4 + 1,
                kind="never_reached", t0=1000.0, step_s=0.5, hang_step=10)
    now, groups, wires = plan.hang_at + 3.0, GroupReader(), []
    for node in range(1, count + 1):
        report = ReportWriter(node_share(count)).report(NodeRanks(plan, node).snapshot(now).ranks, now)
        wires.append(Known.read(nodes.JSON.decode(nodes.JSON.encode(report)), None, groups).wire)
    return wires


def whole(body: dict, ranks: dict) -> str:
    """The head's node file before: the body and its ranks in one call."""
    return json.dumps(stamped(Document.NODE, body | {"ranks": ranks}), default=str)


ARMS = {"one call a node (before)": whole, "a rank at a time (now)": nodes.node_text}


def one_arm(encode, wires: list[dict]) -> dict:
    """The encoding thread's wall time, and the poll's waits for a turn meanwhile."""
    done, waits = threading.Event(), []

    def saver() -> None:
        for node, ranks in enumerate(wires, 1):
            encode({"node_rank": node, "saved_at": time.time()}, ranks)
        done.set()

    thread = threading.Thread(target=saver)
    start = time.perf_counter()
    thread.start()
    while not done.is_set():
        asked = time.perf_counter()
        time.sleep(TICK_S)
        waits.append(time.perf_counter() - asked - TICK_S)
    thread.join()
    return {"encode_s": time.perf_counter() - start, "poll_wait_max_ms": 1000 * max(waits),
            "poll_wait_mean_ms": 1000 * statistics.mean(waits), "poll_turns": len(waits)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--ranks-per-node", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    wires = node_wires(args.nodes, args.ranks_per_node)
    names = list(ARMS)
    rounds = {name: [] for name in names}
    for turn in range(args.rounds):
        for name in names if turn % 2 == 0 else names[::-1]:
            rounds[name].append(one_arm(ARMS[name], wires))
    result = {"nodes": args.nodes, "ranks_per_node": args.ranks_per_node,
              "file_mb": round(len(nodes.node_text({}, wires[0])) / 2 ** 20, 1),
              "machine": f"{platform.machine()}, {platform.python_version()}",
              "arms": {name: {key: statistics.median(run[key] for run in runs) for key in runs[0]}
                       | {"rounds": runs} for name, runs in rounds.items()}}
    before, now = (result["arms"][name] for name in names)
    print(f"{args.nodes} node files of {args.ranks_per_node} ranks ({result['file_mb']} MB each), "
          f"written one after another while the poll asks for a turn every {TICK_S * 1000:g} ms; "
          f"medians of {args.rounds} rounds")
    print("| | one call a node (before) | a rank at a time (now) | before / now |")
    print("|---|---|---|---|")
    for key, label in [("encode_s", "writing them, s"), ("poll_wait_max_ms", "the poll's longest wait, ms"),
                       ("poll_wait_mean_ms", "the poll's mean wait, ms"),
                       ("poll_turns", "turns the poll got")]:
        ratio = f"{before[key] / now[key]:.1f}x" if key != "poll_turns" else "-"
        print(f"| {label} | {before[key]:.3f} | {now[key]:.3f} | {ratio} |")
    if args.json:
        with open(args.json, "w") as sink:
            json.dump(result, sink, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
