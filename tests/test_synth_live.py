"""The live multi-node path with synthetic ranks (diagnose/offline/synth_live.py): a
real `diag launch` head and real agents over the authenticated link on loopback;
only the ranks are synthetic. benchmarks/live_scale.py runs it at 16,384 ranks."""
import json
import time

import pytest

from helpers.run import free_port, left_behind

from diagnose.core.vocab import VerdictKind
from diagnose.offline.synth_live import NodeRanks, Plan, launch

pytestmark = pytest.mark.e2e

TOKEN = "synth-live-token-7a"


def plan(**changes) -> Plan:
    fields = dict(nodes=3, ranks_per_node=8, tp=4, culprit=13, kind=VerdictKind.NEVER_REACHED,
                  t0=time.time() + 4.0, step_s=0.5, hang_step=4)
    return Plan(**fields | changes)


def test_node_ranks_step_and_then_hang_as_planned():
    live = plan(t0=1000.0)
    node = NodeRanks(live, node_rank=2)       # ranks 8-15: the culprit's node
    assert sorted(node.snapshot(live.sent_at(2)).ranks) == list(range(8, 16))
    healthy = node.snapshot(live.sent_at(2) + live.pass_s)
    assert {state.ring_read for state in healthy.ranks.values()} == {3}
    assert all(state.phase.name == "dequeue" for state in healthy.ranks.values())
    hung = node.snapshot(live.hang_at + 3.0)
    culprit = hung.ranks[13]
    assert culprit.ring_read == live.hang_step + 1
    assert all(event.name != "execute_model" or event.step < live.hang_step
               for event in culprit.phases)
    assert hung.ranks[12].phase.name == "forward"     # its TP peer waits in the all_reduce
    assert all(len(state.collectives) <= live.history for state in hung.ranks.values())


@pytest.mark.parametrize("ring_items", [None, 8], ids=["share", "held_back"])
def test_the_head_names_the_planted_culprit_from_its_agents(tmp_path, monkeypatch, ring_items):
    """held_back: 8 ring items saved up a report, one moving rank's rings every few
    reports; the others send their progress."""
    monkeypatch.setenv("DIAG_NODE_TOKEN", TOKEN)
    report = tmp_path / "report.json"
    job = launch(plan(ring_items=ring_items, hang_step=8), str(tmp_path), free_port(),
                 ("--on-hang", "kill", "-o", str(report)))
    try:
        head_exit = job.head.wait(90)
        agent_exits = [agent.wait(30) for agent in job.agents]
    finally:
        job.stop(wait_s=30)
    body = json.loads(report.read_text())
    first = body["verdicts"][0]
    assert (head_exit, first["kind"], first["culprit_ranks"]) == (1, "never_reached", [13]), \
        (tmp_path / "head.out").read_text()[-3000:]
    assert sorted(row["rank"] for row in body["ranks"]) == list(range(24))   # every node's
    assert agent_exits == [1, 1, 1]          # the head's stop reached every agent
    assert not left_behind(job.head_dir)


def test_agents_that_hold_moving_ranks_rings_back_give_no_verdict_while_the_job_steps(tmp_path,
                                                                                     monkeypatch):
    monkeypatch.setenv("DIAG_NODE_TOKEN", TOKEN)
    report = tmp_path / "report.json"
    live = plan(ring_items=8, hang_step=10**6, step_s=0.3)
    job = launch(live, str(tmp_path), free_port(), ("-o", str(report)))
    try:
        time.sleep(live.t0 - time.time() + 20.0)
        assert job.head.poll() is None, (tmp_path / "head.out").read_text()[-3000:]
        nodes = [json.loads((tmp_path / "head" / f"node-{n}.json").read_text()) for n in (1, 2, 3)]
    finally:
        job.stop(wait_s=30)
    held = [rank for node in nodes for rank, body in node["ranks"].items()
            if body["progress_at"] is not None]
    assert held, "no rank's rings were held back: the test would show nothing"
    assert json.loads(report.read_text())["verdicts"] == [], (tmp_path / "head.out").read_text()[-3000:]
    assert not left_behind(job.head_dir)
