"""A live synthetic multi-node job: real `diag` agents and head, synthetic ranks.

    python -m diagnose.offline.synth_live node --head HOST:PORT --node-rank R --plan PLAN.json --run-dir DIR
    python -m diagnose.offline.synth_live driver --plan PLAN.json    (under diag launch)

The head is a real `diag launch --nnodes N --listen ...`; its command is
`driver`, the engine's driver played through the real probe (its own process,
a driver.probe in the head's run dir). Each `node` process is a real agent
(roles.Agent, over nodes.NodeAgent's authenticated link, DIAG_NODE_TOKEN) whose
snapshot comes from `NodeRanks` instead of a collector: the node's ranks of a
TP x PP engine that beat, step every `step_s` and, at step `hang_step`, hang
as synth.hung_job plants it. Only the ranks are synthetic; what crosses the
sockets, the head's merge, analysis, report and TUI are the real ones.

Every process reads the same Plan and the wall clock, so the driver and the
nodes agree on which step runs when without talking to each other.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from diagnose.core.heap import tune_for_large_heaps
from diagnose.core.snapshot import RankState, Snapshot
from diagnose.core.vocab import STARTUP_PHASES, Phase, Role
from diagnose.launch.launcher import POLL_S
from diagnose.launch.node_delta import node_share
from diagnose.offline.synth import OP_S, Job, check_layout, hang_step

STARTUP_S = 0.25     # each start-up phase, ending at the plan's t0


@dataclass(frozen=True)
class Plan:
    nodes: int              # agents, each with ranks_per_node ranks; the head has the driver
    ranks_per_node: int
    tp: int
    culprit: int
    kind: str               # a synth.KINDS verdict kind
    t0: float               # step 0 is sent then (time.time())
    step_s: float
    hang_step: int
    history: int = 16       # phases and records kept per rank (the probe's rings hold 64)
    ring_items: int | None = None   # an agent's report's, of moving ranks; None: as diag's share

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def pp(self) -> int:
        return check_layout(self.world, self.tp, self.culprit)

    @property
    def op_s(self) -> float:
        """A step's pass through every stage takes a quarter of step_s at most."""
        return min(OP_S, self.step_s / (4 * (4 * self.pp + 12)))

    @property
    def pass_s(self) -> float:
        return (4 * self.pp + 12) * self.op_s

    def sent_at(self, step: int) -> float:
        return self.t0 + step * self.step_s

    @property
    def hang_at(self) -> float:
        """When the culprit takes the hung step's message and stops."""
        stage = self.culprit // self.tp
        return self.sent_at(self.hang_step) + self.op_s + stage * 4 * self.op_s

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(asdict(self), f)

    @classmethod
    def load(cls, path: str) -> Plan:
        with open(path) as f:
            return cls(**json.load(f))


class NodeRanks:
    """One node's ranks as the probe would show them at any moment of the plan."""

    def __init__(self, plan: Plan, node_rank: int):
        self.plan = plan
        first = (node_rank - 1) * plan.ranks_per_node
        self.job = Job(plan.tp, plan.pp, now=plan.t0, op_s=plan.op_s)
        mine = range(first, first + plan.ranks_per_node)
        self.job.ranks = {rank: self.job.ranks[rank] for rank in mine}
        for rank, state in self.job.ranks.items():
            state.identity.host = f"synth-node-{node_rank}"
            state.started_at = plan.t0 - len(STARTUP_PHASES) * STARTUP_S
            self.job.startup(rank, state.started_at, STARTUP_S)
            self.job.dequeue(rank, plan.t0)
        self.played = 0        # steps played so far (the hung one included)

    def snapshot(self, now: float) -> Snapshot:
        while self.played < self._due(now):
            self._play(self.played)
            self.played += 1
        for state in self.job.ranks.values():
            state.heartbeat_at = now - 0.05
        return Snapshot(taken_at=now, run_dir="synthetic", ranks=self.job.ranks)

    def _due(self, now: float) -> int:
        """Steps whose pass through the stages has ended by `now`."""
        plan = self.plan
        done = int((now - plan.t0 - plan.pass_s) // plan.step_s) + 1
        return max(0, min(done, plan.hang_step + 1))

    def _play(self, step: int) -> None:
        plan, ranks = self.plan, list(self.job.ranks)
        for state in self.job.ranks.values():
            _leave_dequeue(state)
        sent = plan.sent_at(step)
        if step == plan.hang_step:
            hang_step(self.job, ranks, step, sent, plan.culprit, plan.kind)
        else:
            for rank in ranks:
                self.job.dequeue(rank, self.job.step(rank, step, self.job.stage_start(rank, sent)))
        for state in self.job.ranks.values():
            state.phases = state.phases[-plan.history:]
            state.collectives = state.collectives[-plan.history:]


def _leave_dequeue(state: RankState) -> None:
    """The open dequeue ends where the next step's own begins."""
    for event in [e for e in state.open_phases if e.name == Phase.DEQUEUE]:
        state.open_phases.remove(event)
        state.phases.remove(event)


# -- the processes -------------------------------------------------------------

@dataclass
class LiveJob:
    head: subprocess.Popen
    agents: list[subprocess.Popen]
    head_dir: str

    def stop(self, wait_s: float) -> int | None:
        """SIGTERM to the head, which stops its agents; any left after wait_s are
        killed. The head's exit code."""
        if self.head.poll() is None:
            self.head.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + wait_s
        for process in [self.head] + self.agents:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return self.head.returncode


def launch(plan: Plan, work: str, port: int, head_flags: tuple[str, ...] = (),
           head_cpus: set[int] | None = None, agent_cpus: set[int] | None = None) -> LiveJob:
    """The head (`diag launch` of the driver, run dir WORK/head) and plan.nodes agents
    on 127.0.0.1:port (run dirs WORK/node-R), their outputs in WORK/head.out and
    WORK/node-R.out; each on the given CPUs, if any (as on hosts of their own).
    The environment must hold DIAG_NODE_TOKEN."""
    plan_path = os.path.join(work, "plan.json")
    plan.save(plan_path)
    head_dir, address = os.path.join(work, "head"), f"127.0.0.1:{port}"
    me = [sys.executable, "-m", "diagnose.offline.synth_live"]
    head = _spawn([sys.executable, "-m", "diagnose.cli", "launch", "--nnodes", str(plan.nodes + 1),
                   "--node-rank", "0", "--listen", address, "--run-dir", head_dir, *head_flags,
                   "--", *me, "driver", "--plan", plan_path], work, "head", head_cpus)
    agents = [_spawn([*me, "node", "--head", address, "--node-rank", str(node), "--plan",
                      plan_path, "--run-dir", os.path.join(work, f"node-{node}")],
                     work, f"node-{node}", agent_cpus)
              for node in range(1, plan.nodes + 1)]
    return LiveJob(head, agents, head_dir)


def _spawn(command: list[str], work: str, name: str, cpus: set[int] | None) -> subprocess.Popen:
    pinned = None if cpus is None else functools.partial(os.sched_setaffinity, 0, cpus)
    with open(os.path.join(work, f"{name}.out"), "w") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, preexec_fn=pinned)


def run_node(plan: Plan, head: str, node_rank: int, run_dir: str) -> int:
    """A real agent reporting NodeRanks every launcher poll until the head stops it;
    run_dir is where it carries out the head's dump requests (no rank writes there)."""
    from diagnose.launch.roles import Agent
    tune_for_large_heaps()           # as `diag launch` does for a real agent
    ranks = NodeRanks(plan, node_rank)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    os.makedirs(run_dir, exist_ok=True)
    agent = Agent(head, node_rank, run_dir,
                  node_share(plan.nodes) if plan.ring_items is None else plan.ring_items)
    snapshot = None
    try:
        while True:
            snapshot = ranks.snapshot(time.time())
            found = agent.judge(snapshot)
            if found.stop is not None:
                return found.stop
            time.sleep(POLL_S)
    finally:
        agent.leave(snapshot, 0.0, 0)


def driver_at(plan: Plan, now: float) -> RankState:
    """The driver as `run_driver` plays it, as of `now`, for a head judged in one
    process (benchmarks, tests): each step sent by then in execute_model until
    its pass ends, the hung step's open."""
    job = Job(plan.tp, 1, op_s=plan.op_s)
    for step in range(plan.hang_step + 1):
        sent = plan.sent_at(step)
        if sent > now:
            break
        end = None if step == plan.hang_step or sent + plan.pass_s > now else sent + plan.pass_s
        job.driver_step(step, sent, end)
    job.driver.heartbeat_at = now
    return job.driver


def run_driver(plan: Plan) -> None:
    """The engine's driver, through the real probe: each step scheduled, its
    message written to the ranks' ring, execute_model until the step's pass
    ends; the hung step's never does."""
    from diagnose import probe
    probe.init(Role.DRIVER, world_size=plan.world, tp_size=plan.tp, pp_size=plan.pp)
    step = 0
    while True:
        _sleep_until(plan.sent_at(step))
        with probe.phase(Phase.SCHEDULE):
            probe.ring_state(step + 1)
        with probe.phase(Phase.EXECUTE_MODEL, step):
            _sleep_until(float("inf") if step == plan.hang_step
                         else plan.sent_at(step) + plan.pass_s)
        with probe.phase(Phase.UPDATE_FROM_OUTPUT):
            step += 1


def _sleep_until(at: float) -> None:
    while time.time() < at:
        time.sleep(min(1.0, at - time.time()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m diagnose.offline.synth_live",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=["node", "driver"])
    parser.add_argument("--plan", required=True, help="the Plan's JSON, the same for every process")
    parser.add_argument("--head", help="node: the head's --listen address")
    parser.add_argument("--node-rank", type=int, help="node: 1 to the plan's nodes")
    parser.add_argument("--run-dir", help="node: where it carries out the head's dump requests")
    args = parser.parse_args(argv)
    plan = Plan.load(args.plan)
    if args.role == "driver":
        run_driver(plan)
        return 0
    return run_node(plan, args.head, args.node_rank, args.run_dir)


if __name__ == "__main__":
    sys.exit(main())
