"""What a launcher does beyond running its command, by its place in the job:
alone, the head of a multi-node job, or an agent reporting to the head."""
from __future__ import annotations

from typing import TYPE_CHECKING

from diagnose.analysis import analyze
from diagnose.core.snapshot import Verdict
from diagnose.launch import flight, nodes
from diagnose.launch.collector import request_dump

if TYPE_CHECKING:
    from diagnose.launch.launcher import Launcher

NODE_DUMP_WAIT_S = 3.0  # an agent answers at its next poll, after its own ranks' dump


class Solo:
    """The only launcher of the job: it judges its own ranks."""
    judges = True

    def after_poll(self, launcher: Launcher) -> None:
        launcher.verdicts = analyze(launcher.snapshot, launcher.thresholds)

    def dump_other_nodes(self) -> list[str]:
        return []

    def end(self, exit_code: int, stopped: bool) -> None:
        pass

    def leave(self, launcher: Launcher, stop_grace_s: float, stopped_code: int) -> None:
        pass


class Head(Solo):
    """Node 0 of a multi-node job: it judges every node's ranks and tells the
    agents its verdicts, when to dump and when to stop."""

    def __init__(self, listen: str, run_dir: str, nnodes: int):
        self.hub = nodes.NodeHub(listen, nodes.token_from_env(), run_dir, nnodes)

    def after_poll(self, launcher: Launcher) -> None:
        super().after_poll(launcher)
        self.hub.share_verdicts(launcher.verdicts)

    def dump_other_nodes(self) -> list[str]:
        return self.hub.request_dump(wait_s=NODE_DUMP_WAIT_S)

    def end(self, exit_code: int, stopped: bool) -> None:
        if stopped:            # the other nodes' ranks end with this run
            self.hub.stop_agents(exit_code, wait_s=0)

    def leave(self, launcher: Launcher, stop_grace_s: float, stopped_code: int) -> None:
        # A headless engine node ends once its head is gone; else it is told to.
        if not self.hub.wait_for_agents(stop_grace_s):
            self.hub.stop_agents(stopped_code, wait_s=stop_grace_s)
        self.hub.close()


class Agent:
    """Another node: it sends its ranks to the head after every poll, shows the
    head's verdicts, and carries out the head's dump and stop requests."""
    judges = False

    def __init__(self, head: str, node_rank: int):
        self.link = nodes.NodeAgent(head, nodes.token_from_env(), node_rank)
        self.dumps_done = 0                 # the head's dump requests carried out

    def after_poll(self, launcher: Launcher, finished: bool = False) -> None:
        snapshot = launcher.snapshot
        reply = self.link.publish(snapshot.ranks, snapshot.command_exit, self.dumps_done,
                                  finished)
        if reply is None:
            return
        try:
            launcher.verdicts = [Verdict.from_dict(verdict) for verdict in reply.verdicts]
        except (TypeError, ValueError, KeyError):
            launcher.verdicts = []
        if reply.dump > self.dumps_done:      # the next report carries the stacks
            flight.ask_nccl_ranks(launcher.opts.run_dir)   # dumps stay in this node's run dir
            request_dump(launcher.opts.run_dir)
            self.dumps_done = reply.dump
        if reply.stop is not None and not finished:
            launcher.request_stop(reply.stop, by="head")

    def dump_other_nodes(self) -> list[str]:
        return []

    def end(self, exit_code: int, stopped: bool) -> None:
        pass

    def leave(self, launcher: Launcher, stop_grace_s: float, stopped_code: int) -> None:
        if launcher.snapshot is not None:
            launcher.snapshot.command_exit = launcher.proc.returncode
            self.after_poll(launcher, finished=True)
        self.link.close()


def role_of(listen: str | None, head: str | None, run_dir: str, nnodes: int,
            node_rank: int) -> Solo | Head | Agent:
    if listen:
        return Head(listen, run_dir, nnodes)
    if head:
        return Agent(head, node_rank)
    return Solo()
