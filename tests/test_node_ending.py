"""How a head's run dir records a node at the job's end, and how diag analyze
re-judges it: a link the head closes itself is no drop, and a job the head
stopped is judged as of its stop, not as of its ranks' last beats after it."""
import json
import time

import pytest

from diagnose.core.snapshot import Stop
from diagnose.launch.nodes import NodeAgent, NodeHub, NodeReport, NodeView, merge
from helpers.synthetic import Job
from helpers.run import free_port

pytestmark = pytest.mark.unit

KEY = b"node-ending-key"


def node_file(run_dir):
    return json.loads((run_dir / "node-1.json").read_text())


def wait_for_file(run_dir, predicate):
    deadline = time.monotonic() + 10
    while not predicate(node_file(run_dir)):
        assert time.monotonic() < deadline, node_file(run_dir)
        time.sleep(0.02)
    return node_file(run_dir)


def test_a_link_the_head_closes_is_no_drop_of_the_node(tmp_path):
    port = free_port()
    hub = NodeHub(f"127.0.0.1:{port}", KEY, str(tmp_path), nnodes=2)
    agent = NodeAgent(f"127.0.0.1:{port}", KEY, 1)
    try:
        assert agent.publish({}, None, 0) is not None
        hub.close()                 # the head leaves before the agent said goodbye
        body = wait_for_file(tmp_path, lambda body: not body["connected"])
        assert body["dropped"] is False
    finally:
        agent.close()
        hub.close()


def test_a_link_the_agent_ends_without_goodbye_is_a_drop(tmp_path):
    port = free_port()
    hub = NodeHub(f"127.0.0.1:{port}", KEY, str(tmp_path), nnodes=2)
    agent = NodeAgent(f"127.0.0.1:{port}", KEY, 1)
    try:
        assert agent.publish({}, None, 0) is not None
        agent.close()
        body = wait_for_file(tmp_path, lambda body: not body["connected"])
        assert body["dropped"] is True
    finally:
        hub.close()


def stopped_head(stop_at):
    """Node 0's ranks 0-1, still beating 10 s after the head's stop began."""
    job = Job(tp=2, pp=1)
    job.everyone_started(start=stop_at - 20.0, seconds=1.0)
    snapshot = job.snapshot()
    for state in snapshot.ranks.values():
        state.heartbeat_at = stop_at + 10.0
    snapshot.taken_at = stop_at + 12.0
    snapshot.stop = Stop(at=stop_at, ranks=[0, 1], driver=False)
    return snapshot


@pytest.mark.parametrize("received_before_stop_s, lost", [(1.0, False), (8.0, True)])
def test_a_stopped_job_judges_its_nodes_as_of_the_stop(received_before_stop_s, lost):
    stop_at = 1_000_000.0
    report = NodeReport(1, expected_since=stop_at - 20.0,
                        received_at=stop_at - received_before_stop_s, connected=False)
    merged = merge(stopped_head(stop_at), [NodeView(report, {})], [])
    assert [node.lost for node in merged.nodes] == [lost]


@pytest.mark.parametrize("applied_s_ago, waiting, lost", [
    (5.0, False, True), (5.0, True, False), (30.0, True, False), (65.0, True, True)])
def test_a_node_whose_report_waits_on_a_busy_head_is_not_lost(applied_s_ago, waiting, lost):
    """A node last applied seconds ago is lost, unless a report of it waits on the
    head now (the head fell behind, not the node), and not past the 60 s an agent
    waits for the head's answer."""
    now = 1_000_000.0
    head = Job(tp=2, pp=1)
    head.everyone_started(start=now - 20.0, seconds=1.0)
    snapshot = head.snapshot()
    for state in snapshot.ranks.values():
        state.heartbeat_at = now
    snapshot.taken_at = now
    report = NodeReport(1, expected_since=now - 30.0, received_at=now - applied_s_ago,
                        connected=True, heard_at=now if waiting else None)
    merged = merge(snapshot, [NodeView(report, {})], [])
    assert [node.lost for node in merged.nodes] == [lost]
