"""What crosses an agent's link to the head: each rank's groups as ranges, as a
probe file names them, so that a report grows with the node's ranks alone (as
lists, a group of the whole world made it grow with their square)."""
import json
import time

import pytest

from diagnose.core.schema import Document, stamped
from diagnose.core.snapshot import Snapshot
from diagnose.launch.nodes import NodeAgent, NodeFiles, NodeHub, merge, node_text
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
    saved = json.loads((tmp_path / "node-1.json").read_text())
    assert saved["ranks"]["5"]["identity"]["groups"] == {"tp2": "4-5", "pp": "0-7"}
    nodes, notes, refused = NodeFiles().read(str(tmp_path))
    assert (notes, refused) == ([], [])
    merged = merge(Snapshot(taken_at=0.0, run_dir=str(tmp_path), ranks={}), nodes, notes)
    assert {rank: state.identity.groups for rank, state in merged.ranks.items()} == \
        {rank: state.identity.groups for rank, state in job.ranks.items()}
    assert merged.ranks[0].identity.groups["pp"] is merged.ranks[7].identity.groups["pp"]


def test_node_files_are_decoded_again_only_once_the_head_wrote_them_again(tmp_path):
    job = Job(tp=2, pp=4)
    port = free_port()
    hub = NodeHub(f"127.0.0.1:{port}", KEY, str(tmp_path), nnodes=2)
    agent = NodeAgent(f"127.0.0.1:{port}", KEY, 1)
    files = NodeFiles()
    try:
        assert agent.publish(job.ranks, None, 0) is not None
        [first], _, _ = files.read(str(tmp_path))
        [again], _, _ = files.read(str(tmp_path))
        assert again is first and sorted(first.states) == list(range(8))
        hub.save_all()
        [written], _, _ = files.read(str(tmp_path))
        assert written is not first and sorted(written.states) == list(range(8))
    finally:
        agent.close()
        hub.close()


def test_a_node_file_judges_its_node_as_of_when_the_head_wrote_it(tmp_path):
    """Read a minute after the head wrote it, a node that reported then is not lost:
    the file says nothing of the minute after (a live head writes it again)."""
    job = Job(tp=2, pp=4)
    port = free_port()
    hub = NodeHub(f"127.0.0.1:{port}", KEY, str(tmp_path), nnodes=2)
    agent = NodeAgent(f"127.0.0.1:{port}", KEY, 1)
    try:
        assert agent.publish(job.ranks, None, 0) is not None
    finally:
        hub.close()                          # the head ends first: no drop of the node
        agent.close()
    nodes, _, _ = NodeFiles().read(str(tmp_path))
    later = time.time() + 60.0
    merged = merge(Snapshot(taken_at=later, run_dir=str(tmp_path), ranks={}), nodes, [])
    assert [node.lost for node in merged.nodes] == [False]
    nodes[0].report.saved_at = None          # as if it held no time of its writing
    merged = merge(Snapshot(taken_at=later, run_dir=str(tmp_path), ranks={}), nodes, [])
    assert [node.lost for node in merged.nodes] == [True]


@pytest.mark.parametrize("ranks", [{}, {"0": {"phases": [["dequeue", 3, 1.5, None]], "host": "n\u00e9"},
                                        "17": {"records": [], "error": {"message": "\"q\"\n"}}}])
def test_a_node_file_encoded_rank_by_rank_reads_as_the_whole_body(ranks):
    """node_text encodes a node's ranks one at a time (so that the head's other
    threads run between them); the file is the same JSON document as the body
    encoded at once."""
    body = {"node_rank": 3, "host": "h", "saved_at": 12.5, "dropped": False, "seq": None}
    text = node_text(body, ranks)
    assert json.loads(text) == stamped(Document.NODE, body | {"ranks": ranks})
