"""The live path at scale: a real `diag launch` head and NODES real agents on
loopback, each agent reporting RANKS synthetic ranks (diagnose/offline/synth_live.py),
a hang planted at a chosen step.

    PYTHONPATH=. python benchmarks/live_scale.py [--nodes 16] [--ranks-per-node 1024]
        [--tp 8] [--start-s 20] [--healthy-s 20] [--verdict-wait-s 60] [--cpu-stretch 10]
        [--json benchmarks/results/live_scale.json]

Measures, with psutil on the head's `diag launch` process and its workers: the cores it used
while the job ran healthy and from the planted hang to the verdict (CPU time
over wall time), and its peak RSS; the time from the planted hang (the moment
the culprit took the hung step's message) to the head's verdict line naming it
in its output.log; then `diag tui` on the head's run dir in a pty, its screen
read through pyte (tests/helpers/terminal.py): the time until it names the
culprit, and each key's latency (the key sent until the screen shows what it
changed: until the output that changed it arrived, before pyte parses it in this process).
Every process runs on this host: on a small machine the agents'
work competes with the head's, and the table says the machine and its load.
--head-cores N puts the head (with its workers, judges and the job's driver) and
`diag tui` on N of the cores and the agents on the others, as on hosts of their
own; by default all share every core.

    PYTHONPATH=. python benchmarks/live_scale.py --passes [--nodes 16] [--ranks-per-node 1024]

--passes: instead, in this process, the CPU time of each pass the live path makes
on the same ranks: an agent's report (to JSON) and the head's applying it, whole,
as a healthy step's delta and as a hung node's (three seconds into the hang);
the head writing every node file, and one poll of the head (merging the nodes it
holds, the analysis); the analysis of a head behind its reports while the ranks
step (half the nodes a step behind the others, the driver two steps ahead);
`diag tui` reading the node files, and again unchanged.
Writes benchmarks/results/live_passes.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import secrets
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace

import psutil

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from helpers.run import free_port  # noqa: E402
from helpers.terminal import Terminal  # noqa: E402  (a pty read through pyte)

from diagnose.analysis import analyze  # noqa: E402
from diagnose.analysis.thresholds import Thresholds  # noqa: E402
from diagnose.core.groups import GroupReader  # noqa: E402
from diagnose.launch.launcher import POLL_S  # noqa: E402
from diagnose.launch.node_delta import Known, ReportWriter, node_share  # noqa: E402
from diagnose.core.snapshot import Snapshot  # noqa: E402
from diagnose.launch import nodes  # noqa: E402
from diagnose.offline.synth_live import NodeRanks, Plan, driver_at, launch  # noqa: E402

AIMS = {"head_cores": 1.0, "verdict_s": 5.0, "tui_open_s": 2.0, "key_ms": 100.0}
# (what is typed, what on the screen shows the TUI answered, whether it comes or goes)
KEYS = [("\r", r"CULPRIT \[rank", False),     # the selected rank's detail on the whole width
        ("\r", r"CULPRIT \[rank", True),      # and back to the grid
        ("/", "filter by ranks", True),       # the filter opens
        ("\r", "filter by ranks", False)]     # empty: it closes
KEY_ROUNDS = 3
KEY_WAIT_S = 10.0
OPEN_WAIT_S = 60.0
SCREEN = (160, 48)
SCREEN_TOP = 3            # lines of the screen kept while the TUI opens
SAMPLE_S = 0.1
STOP_WAIT_S = 30.0


@dataclass
class HeadWatch:
    """Samples the head's CPU time and RSS; notes when its output names the culprit."""
    process: psutil.Process
    output_log: str
    culprit_name: str
    # (time, cpu seconds of the head and its workers, of its main process alone)
    samples: list[tuple[float, float, float]] = field(default_factory=list)
    peak_rss: int = 0
    peak_workers_rss: int = 0        # their sum
    verdict_at: float | None = None
    verdict: str = ""
    stopped: bool = False

    def run(self) -> None:
        while not self.stopped:
            try:
                workers = _workers(self.process)
                cpu, main = _cpu_seconds(self.process, workers)
                self.peak_rss = max(self.peak_rss, self.process.memory_info().rss)
                self.peak_workers_rss = max(self.peak_workers_rss, _rss(workers))
            except psutil.Error:
                return
            self.samples.append((time.time(), cpu, main))
            if self.verdict_at is None:
                self._look_for_verdict()
            time.sleep(SAMPLE_S)

    def _look_for_verdict(self) -> None:
        try:
            with open(self.output_log, errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            return
        for line in lines:
            if line.startswith("diag: ") and f"{self.culprit_name} " in line:
                self.verdict_at, self.verdict = time.time(), line
                return

    def cores(self, start: float, end: float, main_only: bool = False) -> float | None:
        inside = [(sample[0], sample[2 if main_only else 1]) for sample in self.samples
                  if start <= sample[0] <= end]
        if len(inside) < 2:
            return None
        (t0, c0), (t1, c1) = inside[0], inside[-1]
        return (c1 - c0) / (t1 - t0)


def _workers(process: psutil.Process) -> list[psutil.Process]:
    """The head's worker processes (those that check large reports): forked, so
    of its command line; not its command's processes (the driver)."""
    command = process.cmdline()
    found = []
    for child in process.children():
        try:
            if child.cmdline() == command:
                found.append(child)
        except psutil.Error:
            continue
    return found


def _cpu_seconds(process: psutil.Process, workers: list[psutil.Process]) -> tuple[float, float]:
    """The CPU time of the head with its workers, and of its main process alone."""
    times = process.cpu_times()
    main = total = times.user + times.system
    for worker in workers:
        try:
            times = worker.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total, main


def _rss(processes: list[psutil.Process]) -> int:
    total = 0
    for process in processes:
        try:
            total += process.memory_info().rss
        except psutil.Error:
            continue
    return total


@dataclass
class TuiTimes:
    open_s: float | None
    view_s: float | None             # until its own view (the grid, the culprit's cell) is up
    key_ms: list[float | None]       # None: the key's change did not show within KEY_WAIT_S
    screens: list[tuple[float, str]]  # (seconds since start, its top lines) while opening


def time_tui(run_dir: str, culprit_name: str, cpus: set[int] | None = None) -> TuiTimes:
    """`diag tui RUN_DIR` in a pty: the time until its screen names the culprit
    (diag launch's verdict, where it shows that first), then until its own view
    is up (the grid with the culprit's cell: before it, a key has no rank to
    act on), then each key of KEY_ROUNDS until the screen shows what it changed."""
    started = time.monotonic()
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus or mine)          # the TUI inherits them
    try:
        term = Terminal([sys.executable, "-m", "diagnose.cli", "tui", run_dir],
                        env=dict(os.environ), columns=SCREEN[0], lines=SCREEN[1])
    finally:
        os.sched_setaffinity(0, mine)
    try:
        screens: list[tuple[float, str]] = []
        opened = _until(term, culprit_name, True, OPEN_WAIT_S, started, screens)
        open_s = None if opened is None else opened - started
        viewed = (opened if opened is not None and re.search(KEYS[0][1], term.text())
                  else _until(term, KEYS[0][1], True, OPEN_WAIT_S, started, screens))
        view_s = None if viewed is None else viewed - started
        key_ms = []
        for _ in range(KEY_ROUNDS):
            for key, pattern, shown in KEYS:
                sent = time.monotonic()
                term.child.send(key)
                answered = _until(term, pattern, shown, KEY_WAIT_S, sent)
                key_ms.append(None if answered is None else 1000 * (answered - sent))
    finally:
        term.child.terminate(force=True)
    return TuiTimes(open_s, view_s, key_ms, screens)


def _until(term: Terminal, pattern: str, shown: bool, wait_s: float, since: float,
           screens: list[tuple[float, str]] | None = None) -> float | None:
    """When output that came after `since` put `pattern` on the screen (or took it
    off, shown=False), timed as it came, before pyte parsed it: pyte's time is the
    terminal's, not the TUI's (a whole screen of 160x48 takes it tens of ms); None
    past wait_s. The screen is searched again only when the TUI changed it: making
    pyte's screen into text takes 3.6 ms, and doing so every 2 ms took most of a
    core from the TUI. `screens` gets the screen's top lines each time they change."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if not term.read(0.002):
            return None
        if term.screen.dirty and term.received_at >= since:
            term.screen.dirty.clear()
            text = term.text()
            if screens is not None:
                _note_top(screens, text, round(term.received_at - since, 2))
            if (re.search(pattern, text) is not None) == shown:
                return term.received_at
    return None


def _note_top(screens: list[tuple[float, str]], text: str, at: float) -> None:
    top = "\n".join(line.rstrip() for line in text.splitlines()[:SCREEN_TOP])
    if not screens or screens[-1][1] != top:
        screens.append((at, top))


def run(args) -> dict:
    world = args.nodes * args.ranks_per_node
    culprit = world * 3 // 4 + 1 if args.culprit is None else args.culprit
    os.environ["DIAG_NODE_TOKEN"] = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="live-scale-") as work:
        t0 = time.time() + args.start_s
        plan = Plan(nodes=args.nodes, ranks_per_node=args.ranks_per_node, tp=args.tp,
                    culprit=culprit, kind=args.kind, t0=t0, step_s=args.step_s,
                    hang_step=math.ceil(args.healthy_s / args.step_s), history=args.history)
        load_before = os.getloadavg()
        head_cpus, agent_cpus = _split_cpus(args.head_cores)
        job = launch(plan, work, free_port(), ("--cpu-stretch", f"{args.cpu_stretch:g}"),
                     head_cpus, agent_cpus)
        name = f"rank {culprit}"
        watch = HeadWatch(psutil.Process(job.head.pid), os.path.join(job.head_dir, "output.log"),
                          name)
        watcher = threading.Thread(target=watch.run, daemon=True)
        watcher.start()
        try:
            deadline = plan.hang_at + args.verdict_wait_s
            while watch.verdict_at is None and time.time() < deadline and job.head.poll() is None:
                time.sleep(SAMPLE_S)
            tui = time_tui(job.head_dir, name, head_cpus)
            load_during = os.getloadavg()
        finally:
            watch.stopped = True
            exit_code = job.stop(STOP_WAIT_S)
        watcher.join()
        said = [line for line in tail(os.path.join(job.head_dir, "output.log"), 10**6)
                if line.startswith("diag: ")]
        outputs = {os.path.basename(path): tail(path) for path in
                   [os.path.join(work, "head.out"), os.path.join(work, "node-1.out")]}
    verdict_s = None if watch.verdict_at is None else watch.verdict_at - plan.hang_at
    return {
        "nodes": args.nodes, "ranks_per_node": args.ranks_per_node, "ranks": world,
        "tp": args.tp, "pp": plan.pp, "culprit": culprit, "kind": args.kind,
        "step_s": args.step_s, "history": args.history, "cpu_stretch": args.cpu_stretch,
        "head_cpus": sorted(head_cpus) if head_cpus else None,
        "head_cores_healthy": watch.cores(t0, plan.hang_at),
        "head_cores_to_verdict": watch.cores(plan.hang_at, watch.verdict_at or time.time()),
        "head_main_cores_healthy": watch.cores(t0, plan.hang_at, main_only=True),
        "head_main_cores_to_verdict": watch.cores(plan.hang_at, watch.verdict_at or time.time(),
                                                  main_only=True),
        "head_peak_rss_mb": watch.peak_rss / 2**20,
        "head_workers_peak_rss_mb": watch.peak_workers_rss / 2**20,
        "hang_at": plan.hang_at, "verdict_s": verdict_s, "verdict": watch.verdict,
        "tui_open_s": tui.open_s, "tui_view_s": tui.view_s, "tui_key_ms": tui.key_ms,
        "tui_open_screens": tui.screens,
        "tui_key_ms_median": _median(tui.key_ms), "tui_key_ms_max": _max(tui.key_ms),
        "head_exit": exit_code,
        "machine": machine(),
        "load_before": load_before, "load_during": load_during, "head_said": said, "outputs": outputs,
    }


def _split_cpus(head_cores: int) -> tuple[set[int] | None, set[int] | None]:
    """The head's CPUs and the agents' (None, None: all share every CPU)."""
    if not head_cores:
        return None, None
    cpus = sorted(os.sched_getaffinity(0))
    if not 0 < head_cores < len(cpus):
        raise SystemExit(f"--head-cores {head_cores}: this host has {len(cpus)} CPUs; "
                         f"give the head 1 to {len(cpus) - 1} of them")
    return set(cpus[:head_cores]), set(cpus[head_cores:])


def _median(values: list) -> float | None:
    return None if None in values else statistics.median(values)


def _max(values: list) -> float | None:
    return None if None in values else max(values)


def tail(path: str, lines: int = 5) -> list[str]:
    try:
        with open(path, errors="replace") as f:
            return f.read().splitlines()[-lines:]
    except OSError:
        return []


def _plain(value: float | None, unit: str) -> str:
    return f"{'-' if value is None else f'{value:.2f} {unit}'} | - | -"


def table(result: dict) -> str:
    def met(value, aim, unit):
        if value is None:
            return f"- | < {aim:g} {unit} | no"
        return f"{value:.2f} {unit} | < {aim:g} {unit} | {'yes' if value < aim else 'no'}"
    rows = [
        ("head, cores used while healthy", met(result["head_cores_healthy"], AIMS["head_cores"], "cores")),
        ("head, cores used from the hang to the verdict",
         met(result["head_cores_to_verdict"], AIMS["head_cores"], "cores")),
        ("verdict after the planted hang", met(result["verdict_s"], AIMS["verdict_s"], "s")),
        ("`diag tui` open", met(result["tui_open_s"], AIMS["tui_open_s"], "s")),
        ("`diag tui`, its own view up (grid, culprit's cell)", _plain(result["tui_view_s"], "s")),
        ("`diag tui` key, median", met(result["tui_key_ms_median"], AIMS["key_ms"], "ms")),
        ("`diag tui` key, max", met(result["tui_key_ms_max"], AIMS["key_ms"], "ms")),
    ]
    lines = ["| | measured | aim | met |", "|---|---|---|---|"]
    lines += [f"| {label} | {cells} |" for label, cells in rows]
    lines.append(f"| head, peak RSS (its workers' together) | {result['head_peak_rss_mb']:.0f} MB "
                 f"({result['head_workers_peak_rss_mb']:.0f} MB) | - | - |")
    return "\n".join(lines)


def passes(args) -> dict:
    """CPU seconds of each pass of the live path: per report of one node (whole,
    a healthy step's delta, a hung one's), per poll of the head (merging the
    nodes it holds, the analysis), and per write and read of the node files."""
    world = args.nodes * args.ranks_per_node
    plan = Plan(nodes=args.nodes, ranks_per_node=args.ranks_per_node, tp=args.tp,
                culprit=world * 3 // 4 + 1, kind=args.kind, t0=1000.0, step_s=args.step_s,
                hang_step=10, history=args.history)
    hung, healthy = plan.hang_at + 3.0, plan.sent_at(plan.hang_step - 3)
    spent: dict[str, float] = {}
    size: dict[str, int] = {}
    known: dict[int, Known] = {}
    groups = GroupReader()

    def report(node: int, writer: ReportWriter, now: float, ranks: dict, kind: str) -> None:
        body = _timed(spent, f"agent_{kind}_s",
                      lambda: nodes.JSON.encode(writer.report(ranks, now)))
        size[kind] = size.get(kind, 0) + len(body)
        known[node] = _timed(spent, f"head_{kind}_s", lambda: Known.read(
            nodes.JSON.decode(body), known.get(node), groups))
        writer.applied(known[node].seq)

    lagging: dict[int, Known] = {}      # odd nodes a step behind the even ones
    for node in range(1, args.nodes + 1):
        synth, writer = NodeRanks(plan, node), ReportWriter(node_share(args.nodes))
        report(node, writer, healthy, synth.snapshot(healthy).ranks, "whole")
        lagging[node] = known[node]
        report(node, writer, healthy + plan.step_s, synth.snapshot(healthy + plan.step_s).ranks,
               "healthy_delta")
        lagging[node] = lagging[node] if node % 2 else known[node]
        synth.snapshot(hung - POLL_S)
        report(node, writer, hung - POLL_S, synth.snapshot(hung - POLL_S).ranks,
               "hung_delta_warmup")
        report(node, writer, hung, synth.snapshot(hung).ranks, "hung_delta")
    with tempfile.TemporaryDirectory(prefix="live-passes-") as run_dir:
        hub = nodes.NodeHub(f"127.0.0.1:{free_port()}", b"passes-key", run_dir, args.nodes + 1)
        try:
            for node, state in known.items():
                hub.reports[node].received_at, hub.reports[node].connected = hung, True
                hub.known[node] = state
            _timed(spent, "head_save_all_s", hub.save_all)
        finally:
            hub.close()
        head = Snapshot(taken_at=hung, run_dir=run_dir, ranks={}, driver=driver_at(plan, hung))
        snapshot = _timed(spent, "poll_merge_s", lambda: nodes.merge(
            replace(head, ranks={}), hub.nodes(), []))
        files = nodes.NodeFiles()
        _timed(spent, "files_read_s", lambda: files.read(run_dir))
        _timed(spent, "files_read_again_s", lambda: files.read(run_dir))
    verdicts = _timed(spent, "poll_analyze_s", lambda: analyze(snapshot))
    behind = nodes.merge(Snapshot(taken_at=healthy + 2 * plan.step_s, run_dir="lagging", ranks={},
                                  driver=driver_at(plan, healthy + 2 * plan.step_s)),
                         [nodes.NodeView(nodes.NodeReport(node, received_at=healthy), state.states)
                          for node, state in lagging.items()], [])
    lagging_verdicts = _timed(spent, "poll_analyze_lagging_s", lambda: analyze(behind))
    per_node = {name: value / args.nodes for name, value in spent.items()
                if name.startswith(("agent_", "head_")) and name != "head_save_all_s"}
    return {"nodes": args.nodes, "ranks_per_node": args.ranks_per_node, "ranks": world,
            "report_kb": {kind: total / args.nodes / 1e3 for kind, total in size.items()},
            **per_node, **{name: value for name, value in spent.items() if name not in per_node},
            "verdicts": len(verdicts), "verdict": verdicts[0].summary if verdicts else None,
            "lagging_verdicts": [verdict.summary for verdict in lagging_verdicts],
            "machine": machine(), "load": os.getloadavg()}


def _timed(spent: dict[str, float], name: str, call):
    began = time.process_time()
    result = call()
    spent[name] = spent.get(name, 0.0) + time.process_time() - began
    return result


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--ranks-per-node", type=int, default=1024)
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--culprit", type=int, help="default: three quarters into the ranks")
    parser.add_argument("--kind", default="never_reached")
    parser.add_argument("--step-s", type=float, default=0.5)
    parser.add_argument("--history", type=int, default=16, help="records kept per rank")
    parser.add_argument("--start-s", type=float, default=20.0,
                        help="from the launch to step 0: the agents start and connect")
    parser.add_argument("--healthy-s", type=float, default=20.0, help="steps before the hang")
    parser.add_argument("--verdict-wait-s", type=float, default=60.0)
    parser.add_argument("--cpu-stretch", type=float, default=Thresholds.cpu_stretch,
                        help="the head's --cpu-stretch (default %(default)g, diag's; 1: off)")
    parser.add_argument("--head-cores", type=int, default=0,
                        help="the head and diag tui on this many cores, the agents on the "
                             "others (default 0: all share every core)")
    parser.add_argument("--passes", action="store_true",
                        help="the CPU time of each pass, in this process (see above)")
    parser.add_argument("--json", help="default: benchmarks/results/live_scale.json "
                                       "(live_passes.json with --passes)")
    args = parser.parse_args()
    if args.passes:
        result = passes(args)
        print(json.dumps(result, indent=1))
        write(result, args.json or "benchmarks/results/live_passes.json")
        return
    result = run(args)
    print(f"{result['ranks']} ranks: {result['nodes']} agents x {result['ranks_per_node']} "
          f"(tp={result['tp']} pp={result['pp']}), culprit rank {result['culprit']} "
          f"({result['kind']}); {result['machine']}"
          f"{'; the head on CPUs ' + str(result['head_cpus']) if result['head_cpus'] else ''}"
          f"; load average "
          f"{result['load_before'][0]:.1f} before, {result['load_during'][0]:.1f} during")
    print(table(result))
    print(f"head's verdict: {result['verdict'] or 'none'}")
    write(result, args.json or "benchmarks/results/live_scale.json")


def write(result: dict, path: str) -> None:
    with open(path, "w") as out:
        json.dump(result, out, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
