"""What a launcher does beyond running its command, by its place in the job:
alone, the head of a multi-node job, or an agent reporting to the head. A role
is handed each poll's snapshot and returns what it found; the launcher applies it."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

from diagnose.analysis import analyze
from diagnose.analysis.thresholds import Thresholds
from diagnose.core.snapshot import Snapshot, Verdict
from diagnose.launch import flight, judging, nodes
from diagnose.launch.collector import request_dump
from diagnose.launch.node_delta import node_share

NODE_DUMP_WAIT_S = 3.0  # an agent answers at its next poll, after its own ranks' dump


@dataclass(frozen=True)
class Found:
    """A role's answer to one poll: the verdicts on the snapshot (on `judged`
    where that is another, earlier one), and the exit code the head asked this
    launcher to stop with, if it did."""
    verdicts: list[Verdict] = field(default_factory=list)
    stop: int | None = None
    judged: Snapshot | None = None


class Solo:
    """The only launcher of the job: it judges its own ranks."""
    judges = True
    hub: nodes.NodeHub | None = None     # the head's: the other nodes' ranks

    def __init__(self, thresholds: Thresholds):
        self.thresholds = thresholds
        self.notes: list[str] = []       # what the role has to say in the report

    def judge(self, snapshot: Snapshot) -> Found:
        return Found(self.judge_verdicts(snapshot))

    def judge_verdicts(self, snapshot: Snapshot) -> list[Verdict]:
        return analyze(snapshot, self.thresholds)

    def dump_other_nodes(self) -> list[str]:
        return []

    def end(self, exit_code: int, stopped: bool) -> None:
        pass

    def leave(self, snapshot: Snapshot | None, stop_grace_s: float,
              stopped_code: int) -> Found | None:
        return None


class Head(Solo):
    """Node 0 of a multi-node job: it judges every node's ranks and tells the
    agents its verdicts, when to dump and when to stop. While the command runs
    it judges in a forked process (judging.py) where the host has the cores:
    each poll gets the latest judgment finished; the last, with the command's
    exit code, is made here."""

    def __init__(self, thresholds: Thresholds, listen: str, run_dir: str, nnodes: int):
        super().__init__(thresholds)
        self.hub = nodes.NodeHub(listen, nodes.token_from_env(), run_dir, nnodes)
        self.judging = judging.ForkedJudge(self.judge_verdicts) if judging.judges_apart() else None

    def judge(self, snapshot: Snapshot) -> Found:
        if self.judging is None or snapshot.command_exit is not None:
            found = super().judge(snapshot)
        else:
            judged = self.judging.judge(snapshot, self.hub.news, self.hub.large_incoming)
            found = Found(list(judged.verdicts) if judged else [],
                          judged=judged.snapshot if judged else None)
            for note in self.judging.notes:
                print(f"diag: {note}", file=sys.stderr)
            self.notes += self.judging.notes
            self.judging.notes.clear()
        self.hub.share_verdicts(found.verdicts)
        return found

    def dump_other_nodes(self) -> list[str]:
        return self.hub.request_dump(wait_s=NODE_DUMP_WAIT_S)

    def end(self, exit_code: int, stopped: bool) -> None:
        if stopped:            # the other nodes' ranks end with this run
            self.hub.stop_agents(exit_code, wait_s=0)

    def leave(self, snapshot: Snapshot | None, stop_grace_s: float,
              stopped_code: int) -> Found | None:
        # A headless engine node ends once its head is gone; else it is told to.
        if self.judging is not None:
            self.judging.close()
        if not self.hub.wait_for_agents(stop_grace_s):
            self.hub.stop_agents(stopped_code, wait_s=stop_grace_s)
        self.hub.close()
        return None


class Agent:
    """Another node: it sends its ranks to the head after every poll, shows the
    head's verdicts, and carries out the head's dump requests; the head's stop
    goes back to the launcher."""
    judges = False
    hub = None

    def __init__(self, head: str, node_rank: int, run_dir: str, ring_items: int | None):
        self.link = nodes.NodeAgent(head, nodes.token_from_env(), node_rank, ring_items)
        self.run_dir = run_dir
        self.notes: list[str] = []
        self.dumps_done = 0                 # the head's dump requests carried out
        self.verdicts: list[Verdict] = []   # the head's latest

    def judge(self, snapshot: Snapshot, finished: bool = False) -> Found:
        reply = self.link.publish(snapshot.ranks, snapshot.command_exit, self.dumps_done,
                                  finished)
        if reply is None:
            return Found(self.verdicts)
        try:
            self.verdicts = [Verdict.from_dict(verdict) for verdict in reply.verdicts]
        except ValueError:
            self.verdicts = []
        if reply.dump > self.dumps_done:      # the next report carries the stacks
            flight.ask_nccl_ranks(self.run_dir)   # dumps stay in this node's run dir
            request_dump(self.run_dir)
            self.dumps_done = reply.dump
        return Found(self.verdicts, None if finished else reply.stop)

    def dump_other_nodes(self) -> list[str]:
        return []

    def end(self, exit_code: int, stopped: bool) -> None:
        pass

    def leave(self, snapshot: Snapshot | None, stop_grace_s: float,
              stopped_code: int) -> Found | None:
        found = None
        if snapshot is not None:
            found = self.judge(snapshot, finished=True)
        self.link.close()
        return found


def role_of(thresholds: Thresholds, listen: str | None, head: str | None, run_dir: str,
            nnodes: int, node_rank: int) -> Solo | Head | Agent:
    if listen:
        return Head(thresholds, listen, run_dir, nnodes)
    if head:
        return Agent(head, node_rank, run_dir, node_share(nnodes - 1))
    return Solo(thresholds)
