"""An agent's reports as changes (diagnose/launch/node_delta.py): what the head
rebuilds from a whole report and the deltas after it is what the agent holds;
a delta the head cannot apply changes nothing it holds and asks for a whole
report, and the link carries both on real sockets."""
import copy
import math
import json
import multiprocessing
from dataclasses import replace
from dataclasses import asdict

import pytest

from diagnose.core.groups import GroupReader
from diagnose.core.rows import as_row, built
from diagnose.core.snapshot import (ActivitySample, CpuWait, DeviceWork, FaultRecord, KVStats,
                                    RaisedError, RankState)
from diagnose.launch import nodes
from diagnose.analysis import analyze
from diagnose.analysis.position import last_progress
from diagnose.launch.node_delta import (HEAD_RING_ITEMS, LISTS, RINGS, Known, ReportWriter,
                                         checked_rows, node_share)
from diagnose.launch.nodes import JSON, NodeAgent, NodeFiles, NodeHub
from diagnose.offline.synth import hung_job
from diagnose.offline.synth_live import NodeRanks, Plan
from helpers.run import free_port

pytestmark = pytest.mark.unit

KEY = b"node-delta-key"
PLAN = Plan(nodes=2, ranks_per_node=8, tp=4, culprit=13, kind="never_reached", t0=1000.0,
            step_s=0.5, hang_step=6)


def crossed(body: dict) -> dict:
    """The body as the head reads it: through the link's JSON."""
    return JSON.decode(JSON.encode(body))


def same(known: Known, ranks: dict) -> bool:
    return {rank: asdict(state) for rank, state in known.states.items()} == \
        {rank: asdict(state) for rank, state in ranks.items()}


def played(until: float, every: float = 0.25):
    """Node 2's ranks (the culprit's) at each report from the start to `until`."""
    node = NodeRanks(PLAN, node_rank=2)
    now = PLAN.t0
    while now <= until:
        yield now, node.snapshot(now).ranks
        now += every


def test_deltas_rebuild_what_the_agent_holds_through_steps_and_the_hang():
    writer, known, groups, sizes = ReportWriter(ring_items=None), None, GroupReader(), []
    for now, ranks in played(PLAN.hang_at + 3.0):
        body = crossed(writer.report(ranks, now))
        sizes.append(len(JSON.encode(body)))
        known = Known.read(body, known, groups)
        writer.applied(known.seq)
        assert same(known, ranks), now
        assert json.loads(json.dumps(known.wire)) == known.wire   # the node file's form
    assert sizes[0] > 10 * sizes[-1]      # the whole report, then a hung node's heartbeats
    assert known.states[13].identity.groups["pp"] is known.states[9].identity.groups["pp"]


def test_a_state_handed_out_stays_as_it_was_while_deltas_arrive():
    writer, known, groups = ReportWriter(ring_items=None), None, GroupReader()
    held = None
    for now, ranks in played(PLAN.sent_at(3)):
        known = Known.read(crossed(writer.report(ranks, now)), known, groups)
        writer.applied(known.seq)
        if held is None and now >= PLAN.sent_at(1):
            held, frozen = known.states, copy.deepcopy(known.states)
    assert {r: asdict(s) for r, s in held.items()} == {r: asdict(s) for r, s in frozen.items()}
    assert not same(Known(0, held, {}), known.states)


def test_a_delta_on_a_report_the_head_lacks_is_refused_and_a_whole_one_follows():
    writer, groups = ReportWriter(ring_items=None), GroupReader()
    reports = played(PLAN.sent_at(2))
    now, first = next(reports)
    known = Known.read(crossed(writer.report(first, now)), None, groups)
    writer.applied(known.seq)
    now, ranks = next(reports)
    lost = crossed(writer.report(ranks, now))      # never reaches the head
    writer.applied(None)                      # which says so: the next is whole
    assert lost["base"] is not None
    now, ranks = next(reports)
    body = crossed(writer.report(ranks, now))
    assert body["base"] is None
    with pytest.raises(ValueError, match="does not hold"):
        Known.read(dict(lost, base=lost["base"] + 5), known, groups)
    known = Known.read(body, known, groups)
    assert same(known, ranks)


def ring_items(body: dict, ranks: set[str]) -> int:
    """The ring items a delta carries for `ranks`."""
    return sum(len(body["changes"][rank].get("lists", {}).get(name, [0, 0, 0, []])[3])
               for rank in ranks & body["changes"].keys() for name in RINGS)


@pytest.mark.parametrize("budget", [40, 10])
def test_a_node_past_its_ring_items_holds_moving_ranks_back_and_their_progress_still_counts(budget):
    """40: one rank's rings a report; 10: saved up over reports for one."""
    writer, known, groups = ReportWriter(ring_items=budget), None, GroupReader()
    behind_for: dict[int, int] = {}     # rank -> reports in a row its rings were held back
    longest, held, progress = 0, 0, {}
    for now, ranks in played(PLAN.hang_at + 2.0):
        body = crossed(writer.report(ranks, now))
        known = Known.read(body, known, groups)
        writer.applied(known.seq)
        moved = {str(rank) for rank, state in ranks.items()
                 if progress.get(rank) != last_progress(state)}
        progress = {rank: last_progress(state) for rank, state in ranks.items()}
        largest = max(sum(len(getattr(state, name)) for name in RINGS) for state in ranks.values())
        if body["base"] is not None:
            assert ring_items(body, moved) <= max(budget, largest), now
        for rank, state in known.states.items():       # its progress, to a tenth of a second
            assert 0 <= progress[rank] - last_progress(state) < 0.1, (now, rank)
            late = any(getattr(state, name) != getattr(ranks[rank], name) for name in RINGS)
            behind_for[rank] = behind_for.get(rank, 0) + 1 if late else 0
            assert late == (state.progress_at is not None), (now, rank)
            assert late or state.ring_read == ranks[rank].ring_read, (now, rank)
        longest = max(longest, *behind_for.values())
        held += len(body.get("progress", []))
    assert held and 2 <= longest <= len(ranks) * math.ceil(largest / budget)   # each in turn
    assert same(known, ranks)              # every rank stopped: the head holds what the agent does


@pytest.mark.parametrize("kind", ["never_reached", "stuck_in_phase", "collective_missing_peers"])
def test_a_rank_whose_rings_are_held_back_is_judged_by_none_of_them(kind):
    """A moving rank's rings, held back, may be seconds old: never a stall."""
    job = hung_job(16, 4, 13, kind)
    [verdict] = analyze(job.snapshot())
    assert verdict.culprit_ranks == [13]
    for state in job.ranks.values():
        state.progress_at = job.now - 0.3          # each moved, their rings not yet sent
    assert analyze(job.snapshot()) == []
    for rank in range(12, 16):                     # the rings of the culprit's TP group
        job.ranks[rank].progress_at = None         # came: it is named, the rest held back
    [verdict] = analyze(job.snapshot())
    assert verdict.culprit_ranks == [13] and verdict.kind == kind


def test_the_heads_ring_items_are_shared_by_its_nodes():
    assert node_share(16) * 16 == HEAD_RING_ITEMS
    assert [node_share(n) for n in (1, 2048, 10**6)] == [HEAD_RING_ITEMS, 4, 1]


def test_a_rank_that_died_holds_nothing_back():
    writer, known, groups = ReportWriter(ring_items=1), None, GroupReader()
    for now, ranks in played(PLAN.sent_at(4)):
        ranks[9].alive = False            # its pid gone, its file still stepping
        known = Known.read(crossed(writer.report(ranks, now)), known, groups)
        writer.applied(known.seq)
        assert known.states[9].progress_at is None
        assert all(getattr(known.states[9], name) == getattr(ranks[9], name) for name in RINGS)
    assert any(state.progress_at is not None for state in known.states.values())


def test_a_nodes_last_report_holds_no_ring_back():
    writer, known, groups = ReportWriter(ring_items=1), None, GroupReader()
    for now, ranks in played(PLAN.sent_at(3)):
        body = crossed(writer.report(ranks, now, complete=now >= PLAN.sent_at(3) - 0.25))
        known = Known.read(body, known, groups)
        writer.applied(known.seq)
    assert body["base"] is not None and not body["progress"]
    assert same(known, ranks)


def garbled(body: dict) -> list[dict]:
    """A delta made wrong in each way a peer might, every one well-formed JSON."""
    rank = next(iter(body["changes"]))
    change = body["changes"][rank]
    name = next(iter(change["lists"]))
    had, drop, keep, added = change["lists"][name]
    return [
        dict(body, changes={rank: dict(change, lists={name: [had + 1, drop, keep, added]})}),
        dict(body, changes={rank: dict(change, lists={name: [had, had, 1, added]})}),
        dict(body, changes={rank: dict(change, lists={name: [had, drop, keep, [{"x": 1}]]})}),
        dict(body, changes={rank: dict(change, lists={name: [had, drop, keep, [[1, 2]]]})}),
        dict(body, changes={rank: dict(change, lists={name: [had, drop, keep, [added[0][:-1] + ["?"]]]})}),
        dict(body, changes={rank: {"set": {"alive": "yes"}}}),
        dict(body, changes={rank: {"set": {"no_such_field": 1}}}),
        dict(body, changes={rank: {"set": {"identity": {"rank": 1}}}}),
        dict(body, changes={"99": change}),
        dict(body, changes={"-1": change}),
        dict(body, beats=[[1.0, "0-99"]]),
        dict(body, beats=[["soon", "8"]]),
        dict(body, beats=[[1.0]]),
        dict(body, progress=[[1.0, "0-99"]]),
        dict(body, progress=[[float("nan"), "8"]]),
        dict(body, progress={"8": 1.0}),
        dict(body, gone=[99]),
        dict(body, ranks={"8": {"identity": "x"}}),
        dict(body, ranks={"8": {"identity": {}}}),
        dict(body, changes=[]),
        dict(body, seq="9"),
    ]


def test_a_garbled_delta_changes_nothing_the_head_holds():
    writer, groups = ReportWriter(ring_items=None), GroupReader()
    reports = played(PLAN.sent_at(2))
    now, first = next(reports)
    known = Known.read(crossed(writer.report(first, now)), None, groups)
    writer.applied(known.seq)
    before = {rank: asdict(state) for rank, state in known.states.items()}
    wire = json.dumps(known.wire, sort_keys=True)
    now, ranks = next(reports)
    body = crossed(writer.report(ranks, now))
    assert body["changes"], "the step should have changed the ranks"
    for bad in garbled(body):
        with pytest.raises(ValueError):
            Known.read(bad, known, groups)
        with pytest.raises(ValueError):       # as a head's worker checks it, then the head
            Known.read(checked_rows(copy.deepcopy(bad)), known, groups, rows_checked=True)
    assert {rank: asdict(state) for rank, state in known.states.items()} == before
    assert json.dumps(known.wire, sort_keys=True) == wire
    assert same(Known.read(body, known, groups), ranks)   # the real one still applies


class RawAgent(NodeAgent):
    """A real agent whose next report can be replaced: what a buggy peer sends."""
    replace_next = None

    def publish(self, ranks, command_exit, dump_done, finished=False):
        if self.replace_next is not None:
            body, self.replace_next = self.replace_next, None
            self.link.send(body)
            reply = self.link.recv()
            self.writer.applied(reply.get("applied"))
            return reply
        return super().publish(ranks, command_exit, dump_done, finished)


def test_over_the_link_the_head_applies_deltas_and_resyncs_after_garbage(tmp_path):
    port = free_port()
    hub = NodeHub(f"127.0.0.1:{port}", KEY, str(tmp_path), nnodes=3)
    agent = RawAgent(f"127.0.0.1:{port}", KEY, 2)
    reports = played(PLAN.hang_at + 1.0)
    try:
        for _ in range(4):
            now, ranks = next(reports)
            assert agent.publish(ranks, None, 0) is not None
        [node] = [n for n in hub.nodes() if n.report.node_rank == 2]
        assert same(Known(0, node.states, {}), ranks)
        agent.replace_next = {"seq": 99, "base": 12345, "changes": {"8": {"set": {"alive": 3}}}}
        reply = agent.publish(ranks, None, 0)
        assert reply["applied"] is None and agent.writer.acked is None
        [node] = [n for n in hub.nodes() if n.report.node_rank == 2]
        assert same(Known(0, node.states, {}), ranks)          # unchanged by the garbage
        for _, ranks in reports:
            assert agent.publish(ranks, None, 0) is not None
        assert agent.writer.acked is not None                  # deltas again after the resync
        [node] = [n for n in hub.nodes() if n.report.node_rank == 2]
        assert same(Known(0, node.states, {}), ranks)
    finally:
        agent.close()
        hub.close()
    saved = json.loads((tmp_path / "node-2.json").read_text())
    assert sorted(saved["ranks"], key=int) == [str(rank) for rank in range(8, 16)]
    assert saved["ranks"]["13"]["heartbeat_at"] == ranks[13].heartbeat_at


def test_large_reports_checked_by_the_heads_workers_apply_as_the_ones_checked_here(
        tmp_path, monkeypatch):
    """Every report past WORKER_BYTES (here: all) is decoded and checked by a worker
    process; the head holds what the agent does, a garbled item is refused as
    the head's own check refuses it, and the workers end with the hub."""
    monkeypatch.setattr(nodes, "WORKER_BYTES", 0)
    port = free_port()
    hub = NodeHub(f"127.0.0.1:{port}", KEY, str(tmp_path), nnodes=3, readers=2)
    assert hub.readers is not None and len(multiprocessing.active_children()) == 2
    agent = RawAgent(f"127.0.0.1:{port}", KEY, 2)
    reports = played(PLAN.hang_at + 1.0)
    try:
        for _ in range(4):
            now, ranks = next(reports)
            agent.publish(ranks, None, 0)
            assert agent.writer.acked is not None                   # applied
        [node] = [n for n in hub.nodes() if n.report.node_rank == 2]
        assert same(Known(0, node.states, {}), ranks)
        held = ranks_as_dicts(ranks)            # (the synthetic ranks change in place)
        later, moved = next((at, ranks) for at, ranks in reports if at >= now + PLAN.step_s)
        bad = crossed(agent.writer.report(moved, later))
        change = next(change for change in bad["changes"].values() if change.get("lists"))
        next(iter(change["lists"].values()))[3].append(["not", "a", "row"])
        agent.replace_next = bad
        assert agent.publish(moved, None, 0)["applied"] is None
        [node] = [n for n in hub.nodes() if n.report.node_rank == 2]
        assert ranks_as_dicts(node.states) == held                # unchanged by the garbage
        for _, ranks in reports:
            agent.publish(ranks, None, 0)
        assert agent.writer.acked is not None                       # deltas again
        [node] = [n for n in hub.nodes() if n.report.node_rank == 2]
        assert same(Known(0, node.states, {}), ranks)
    finally:
        agent.close()
        hub.close()
    assert multiprocessing.active_children() == []


def test_a_node_file_of_either_schema_reads_back_as_the_ranks_the_head_held(tmp_path):
    """Schema 2 writes a rank's list items as rows; files of schema 1 hold objects."""
    ranks = saved_node_files(tmp_path)[2]
    path = tmp_path / "node-2.json"
    saved = json.loads(path.read_text())
    assert saved["schema_version"] == 2 and type(saved["ranks"]["13"]["phases"][0]) is list
    assert refused_none_and_node_2(tmp_path) == ranks_as_dicts(ranks)
    for rank, body in saved["ranks"].items():           # as a head of schema 1 wrote them
        body.update({name: [asdict(item) for item in getattr(ranks[int(rank)], name)]
                     for name in LISTS})
    path.write_text(json.dumps(saved | {"schema_version": 1}))
    assert refused_none_and_node_2(tmp_path) == ranks_as_dicts(ranks)


def refused_none_and_node_2(run_dir) -> dict:
    nodes, _, refused = NodeFiles().read(str(run_dir))
    assert refused == []
    [node] = [node for node in nodes if node.report.node_rank == 2]
    return ranks_as_dicts(node.states)


def ranks_as_dicts(ranks: dict) -> dict:
    return {rank: asdict(state) for rank, state in ranks.items()}


def saved_node_files(run_dir, nodes_=(2,)) -> dict[int, dict]:
    """The node files a head writes for these nodes (PLAN's ranks, as of an hour
    past the hang); each node's ranks as the agent held them."""
    hub = NodeHub(f"127.0.0.1:{free_port()}", KEY, str(run_dir), nnodes=max(nodes_) + 1)
    held = {}
    try:
        for node in nodes_:
            writer, known, synth = ReportWriter(ring_items=None), None, NodeRanks(PLAN, node)
            for now in (PLAN.hang_at, PLAN.hang_at + 1.0):
                held[node] = synth.snapshot(now).ranks
                known = Known.read(crossed(writer.report(held[node], now)), known, hub.groups)
                writer.applied(known.seq)
            hub.reports[node].received_at, hub.reports[node].connected = now, True
            hub.known[node] = known
        hub.save_all()
    finally:
        hub.close()
    return held


def test_a_state_and_everything_in_it_comes_back_from_its_row():
    [state] = [state for state in NodeRanks(PLAN, 2).snapshot(PLAN.hang_at).ranks.values()
               if state.collectives][:1]
    full = replace(state, kv=KVStats(3, 10, 20, 30, 40, 0), fault=FaultRecord("hang", None),
                   device_pending=DeviceWork("execute_model", 4, 1.5),
                   activity=ActivitySample("collective", 2.0, 77, frames=["a.py:1 f"]),
                   error=RaisedError(77, 3.0, "execute_model", 4, "RuntimeError: x", None),
                   cpu_waits=[CpuWait(1.0, 0.5), CpuWait(2.0, 0.75)], stacks={"main": ["f"]})
    for one in (state, full):
        row = as_row(one)
        assert json.loads(json.dumps(row)) == row                   # plain data only
        assert asdict(built(RankState, row)) == asdict(one)


def test_node_files_read_by_workers_are_the_ones_read_here(tmp_path, monkeypatch):
    held = saved_node_files(tmp_path, (1, 2))
    (tmp_path / "node-3.json").write_text("{not json")
    read_here = nodes.NodeFiles().read(str(tmp_path))
    monkeypatch.setattr(nodes, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(nodes, "cores", lambda: 2)        # workers even on one core
    read_by_workers = nodes.NodeFiles().read(str(tmp_path))
    assert multiprocessing.active_children() == []                 # the pool ended with the read
    for read in (read_here, read_by_workers):
        views, notes, refused = read
        assert notes == [] and len(refused) == 1 and refused[0].startswith("node-3.json: ")
        assert {view.report.node_rank: ranks_as_dicts(view.states) for view in views} == \
            {node: ranks_as_dicts(ranks) for node, ranks in held.items()}
    assert read_here[2] == read_by_workers[2]
