"""The head's forked judge (diagnose/launch/judging.py): real forks of this process,
real analyses of synthetic jobs. Its verdicts are the ones the analysis makes here,
paired with the snapshot they are on; a judge left behind by newer reports is
ended; one that fails is made up for here; none is left running."""
import multiprocessing
import os
import time
from dataclasses import asdict

import pytest

from helpers.run import free_port

from diagnose.analysis import analyze
from diagnose.analysis.thresholds import Thresholds
from diagnose.core.snapshot import Snapshot
from diagnose.core.vocab import VerdictKind
from diagnose.launch import judging, nodes
from diagnose.launch.judging import ForkedJudge
from diagnose.launch.nodes import NodeAgent, merge
from diagnose.launch.roles import Found, Head
from diagnose.offline.synth import hung_job
from diagnose.offline.synth_live import NodeRanks, Plan, driver_at

pytestmark = pytest.mark.skipif(not judging.can_fork(), reason="the judge forks (Linux)")

WAIT_S = 30.0


def hung(ranks: int = 64, culprit: int = 13):
    return hung_job(ranks, 4, culprit, VerdictKind.NEVER_REACHED, now=1000.0).snapshot()


def finished(judge: ForkedJudge, snapshot, generation: int = 0):
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        judged = judge.judge(snapshot, generation)
        if judged is not None:
            return judged
        time.sleep(0.01)
    raise AssertionError("no judgment within the wait")


def children() -> set[int]:
    """This process's children that have not been reaped."""
    task = f"/proc/{os.getpid()}/task"
    found = set()
    for tid in os.listdir(task):
        with open(f"{task}/{tid}/children") as f:
            found.update(int(pid) for pid in f.read().split())
    return found


class Recorded(ForkedJudge):
    """A judge that notes every process it forks (other tests may leave children
    of their own, a resource tracker say: only the judges' are looked for)."""

    def __init__(self, analysis):
        super().__init__(analysis)
        self.pids: set[int] = set()

    def _start(self, snapshot, generation):
        running = super()._start(snapshot, generation)
        self.pids.add(running.pid)
        return running


def none_left(judge: Recorded) -> bool:
    return bool(judge.pids) and not judge.pids & children()


@pytest.mark.unit
def test_a_forked_judgment_is_the_analysis_made_here_on_the_snapshot_it_was_given():
    snapshot = hung()
    judge = Recorded(analyze)
    assert judge.judge(snapshot, 0) is None and judge.running is not None   # started
    judged = finished(judge, snapshot)
    assert judged.snapshot is snapshot
    here = analyze(snapshot)
    assert [asdict(verdict) for verdict in judged.verdicts] == [asdict(v) for v in here]
    assert judged.verdicts[0].culprit_ranks == [13]
    judge.close()
    assert judge.notes == [] and none_left(judge)


@pytest.mark.unit
def test_a_judge_whose_snapshot_predates_a_large_report_is_ended_and_started_again(
        monkeypatch):
    monkeypatch.setattr(judging, "STALE_S", 0.5)
    home = os.getpid()

    def analysis(snapshot):
        if os.getpid() != home:
            time.sleep(60)               # only in the judges: ended long before
        return analyze(snapshot)
    judge = Recorded(analysis)
    first, second = hung(culprit=13), hung(culprit=21)
    judge.judge(first, 0)
    pid = judge.running.pid
    assert judge.judge(second, 1) is None
    assert judge.running.pid != pid and judge.running.snapshot is second
    assert pid not in children()                 # the first ended and reaped
    time.sleep(0.6)                              # held up past STALE_S by newer reports:
    pid = judge.running.pid
    judge.judge(first, 2)                        # the running judge is let finish
    assert judge.running.pid == pid and judge.running.snapshot is second
    judge.close()
    assert none_left(judge)


@pytest.mark.unit
def test_a_healthy_job_is_judged_half_the_time_and_news_is_judged_at_once():
    judge = Recorded(analyze)
    snapshot = hung(ranks=256)
    finished(judge, snapshot)
    assert judge.running is None and judge.took > 0
    judge.took = 60.0                            # as if the last judgment took a minute
    judge.alert_until = 0.0                      # and no large report came lately:
    judge.judge(snapshot, 0)
    assert judge.running is None                 # the next waits two minutes from its start
    judge.judge(snapshot, 1)                     # a large report: judged at once
    assert judge.running is not None and judge.running.generation == 1
    assert judge.alert_until > time.monotonic() + judging.ALERT_S - 1
    judge.close()
    assert none_left(judge)


@pytest.mark.unit
def test_no_judge_starts_while_a_large_report_comes_in_unless_held_up_too_long(monkeypatch):
    monkeypatch.setattr(judging, "STALE_S", 0.5)
    judge = Recorded(analyze)
    snapshot = hung()
    assert judge.judge(snapshot, 0, incoming=True) is None
    assert judge.running is None                 # the poll's snapshot is about to be old
    judged = finished(judge, snapshot, 1)        # the report in: judged at once
    assert judged.verdicts[0].culprit_ranks == [13]
    judge.close()                                # the next, started back to back, ended
    judge.judge(snapshot, 1, incoming=True)      # and another large report coming in
    assert judge.running is None
    time.sleep(0.6)                              # reports that never stop coming:
    judge.judge(snapshot, 1, incoming=True)      # held up past STALE_S, one starts anyway
    assert judge.running is not None
    judge.close()
    assert none_left(judge)


@pytest.mark.unit
def test_a_judge_that_fails_is_made_up_for_here_with_a_note(monkeypatch):
    in_judge = {"pid": os.getpid()}

    def analysis(snapshot):
        if os.getpid() != in_judge["pid"]:
            raise RuntimeError("a bug in the analysis, in the judge only")
        return analyze(snapshot)
    judge = Recorded(analysis)
    snapshot = hung()
    judged = finished(judge, snapshot)
    assert judged.verdicts[0].culprit_ranks == [13]          # judged here
    assert len(judge.notes) == 1 and "judged in the head instead" in judge.notes[0]
    judge.close()
    assert none_left(judge)


@pytest.mark.unit
def test_a_judge_past_its_time_is_ended_and_its_snapshot_judged_here(monkeypatch):
    monkeypatch.setattr(judging, "JUDGE_WAIT_S", 0.2)
    home = os.getpid()

    def analysis(snapshot):
        if os.getpid() != home:
            time.sleep(60)
        return analyze(snapshot)
    judge = Recorded(analysis)
    judged = finished(judge, hung())
    assert judged.verdicts[0].culprit_ranks == [13]
    assert "ran past 0.2 s" in judge.notes[0]
    judge.close()
    assert none_left(judge) and multiprocessing.active_children() == []


@pytest.mark.e2e
def test_a_head_judges_its_nodes_in_a_fork_and_names_the_culprit(tmp_path, monkeypatch):
    """An in-process head (roles.Head: its real hub, a forked judge even on this
    machine's cores) and two real agents over the link, which report synthetic
    ranks in real time until past the planted hang; every report is large, so
    each is news. The verdict is the analysis of the snapshot it is paired with."""
    monkeypatch.setattr(judging, "MIN_CORES", 1)
    monkeypatch.setattr(judging, "ForkedJudge", Recorded)
    monkeypatch.setattr(nodes, "WORKER_BYTES", 0)
    monkeypatch.setenv("DIAG_NODE_TOKEN", "judging-token")
    plan = Plan(nodes=2, ranks_per_node=8, tp=4, culprit=13, kind="never_reached",
                t0=time.time() + 0.5, step_s=0.25, hang_step=6)
    port = free_port()
    head = Head(Thresholds(), f"127.0.0.1:{port}", str(tmp_path), nnodes=3)
    agents = {node: NodeAgent(f"127.0.0.1:{port}", b"judging-token", node) for node in (1, 2)}
    ranks = {node: NodeRanks(plan, node) for node in agents}
    found = Found()
    try:
        assert head.judging is not None
        while time.time() < plan.hang_at + 8.0 and not found.verdicts:
            now = time.time()
            for node, agent in agents.items():
                agent.publish(ranks[node].snapshot(now).ranks, None, 0)
            snapshot = merge(Snapshot(taken_at=now, run_dir=str(tmp_path), ranks={},
                                      driver=driver_at(plan, now)),
                             head.hub.nodes(), [])
            found = head.judge(snapshot)
            time.sleep(0.1)
        assert found.verdicts and found.verdicts[0].culprit_ranks == [13]
        assert found.judged is not None and found.judged.taken_at > plan.hang_at + 2.0
        assert [asdict(v) for v in found.verdicts] == [asdict(v) for v in analyze(found.judged)]
    finally:
        for agent in agents.values():
            agent.close()
        head.leave(None, 0.0, 130)
    assert none_left(head.judging) and head.judging.running is None


@pytest.mark.unit
def test_a_failed_judges_note_goes_to_the_heads_report(tmp_path, monkeypatch):
    """The head's judge fails in its fork: the head judges that snapshot itself,
    says so on stderr, and keeps the note for the report it writes (roles.Head.notes,
    which Launcher.write_report takes)."""
    monkeypatch.setattr(judging, "MIN_CORES", 1)
    monkeypatch.setenv("DIAG_NODE_TOKEN", "judging-token")
    head = Head(Thresholds(), f"127.0.0.1:{free_port()}", str(tmp_path), nnodes=2)
    home = os.getpid()

    def analysis(snapshot):
        if os.getpid() != home:
            raise RuntimeError("the judge fails")
        return analyze(snapshot)
    try:
        head.judging.analyze = analysis
        deadline = time.monotonic() + WAIT_S
        found = Found()
        while not found.verdicts and time.monotonic() < deadline:
            found = head.judge(hung())
            time.sleep(0.01)
        assert found.verdicts[0].culprit_ranks == [13]
        [note] = head.notes
        assert note.startswith("the forked analysis failed (it ended with status")
        assert head.judging.notes == []
    finally:
        head.leave(None, 0.0, 130)
