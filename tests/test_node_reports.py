"""What crosses an agent's link to the head: each rank's groups as ranges, as a
probe file names them, so that a report grows with the node's ranks alone (as
lists, a group of the whole world made it grow with their square)."""
import pytest

from diagnose.core.groups import GroupReader
from diagnose.core.snapshot import Snapshot
from diagnose.launch.nodes import NodeAgent, NodeHub, merge, read_reports
from helpers.run import free_port
from helpers.synthetic import Job

pytestmark = pytest.mark.unit

KEY = b"node-reports-key"


def test_groups_cross_as_ranges_and_the_head_reads_them_back_shared(tmp_path):
    job = Job(tp=2, pp=4)
    port = free_port()
    hub = NodeHub(f"127.0.0.1:{port}", KEY, str(tmp_path), nnodes=2)
    agent = NodeAgent(f"127.0.0.1:{port}", KEY, 1)
    try:
        assert agent.publish(job.ranks, None, 0) is not None
    finally:
        agent.close()
        hub.close()
    reports, notes = read_reports(str(tmp_path))
    assert reports[0].ranks["5"]["identity"]["groups"] == {"tp2": "4-5", "pp": "0-7"}
    merged = merge(Snapshot(taken_at=0.0, run_dir=str(tmp_path), ranks={}), reports, notes,
                   GroupReader())
    assert {rank: state.identity.groups for rank, state in merged.ranks.items()} == \
        {rank: state.identity.groups for rank, state in job.ranks.items()}
    assert merged.ranks[0].identity.groups["pp"] is merged.ranks[7].identity.groups["pp"]
