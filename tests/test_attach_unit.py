"""diag attach's parts that need no job: how a rank is told from its title or
command line, when a rank moved, the refusal line, and the snapshot a run dir
holds as JSON (read back by diag analyze and diag tui)."""
import json
from dataclasses import asdict

import pytest

from diagnose.analysis import analyze
from diagnose.core.layout import Layout
from diagnose.core.snapshot import ActivitySample, Identity, RankState, Snapshot
from diagnose.core.vocab import Activity
from diagnose.core.schema import Document, stamped
from diagnose.launch.rundir import RunDirError, SnapshotSource, open_run
from synthetic import Job
from diagnose.offline.synth import hung_job

pytestmark = pytest.mark.unit


def test_a_snapshot_written_as_json_is_judged_again_the_same(tmp_path):
    snapshot = hung_job(8, 2, 6, "never_reached", now=1000.0).snapshot()
    (tmp_path / Document.SNAPSHOT).write_text(
        json.dumps(stamped(Document.SNAPSHOT, asdict(snapshot))))
    source = open_run(str(tmp_path))
    assert isinstance(source, SnapshotSource)
    read = source.snapshot()
    assert read.ranks.keys() == snapshot.ranks.keys() and read.run_dir == str(tmp_path)
    assert [asdict(v) for v in source.verdicts(read)] == [asdict(v) for v in analyze(snapshot)]


def test_a_malformed_snapshot_is_one_line(tmp_path):
    body = asdict(Job().snapshot())
    body["ranks"][0]["heartbeat_at"] = "soon"
    (tmp_path / Document.SNAPSHOT).write_text(json.dumps(body))
    with pytest.raises(RunDirError, match=r"snapshot.json: malformed rank state: .*heartbeat_at"):
        open_run(str(tmp_path))


def stack_only_job(doing: dict[int, str], moved: set[int] = frozenset(), tp: int = 2,
                   pp: int = 4) -> Snapshot:
    """A job seen only from outside, as diag attach sees it: samples from 100.0 to
    104.0, every rank's stack still unless `moved`; `doing`: rank -> activity
    (idle where not given)."""
    layout = Layout(tp, pp)
    ranks = {}
    for rank in range(layout.world_size):
        pp_rank, tp_rank = layout.place(rank)
        identity = Identity("worker", rank, layout.world_size, tp_rank, tp, pp_rank, pp, "h",
                            1000 + rank, "", groups=layout.groups())
        found = doing.get(rank, Activity.IDLE)
        frame = f"engine/x.py:{rank} f{rank}"
        ranks[rank] = RankState(
            identity=identity, started_at=100.0, heartbeat_at=104.0, alive=True,
            open_phases=[], frame=frame, phases=[], collectives=[],
            stacks={"MainThread": ["a.py:1 main", frame]},
            frame_moved_at=103.0 if rank in moved else 100.0,
            activity=ActivitySample(found, 104.0, 1000 + rank, frame=frame))
    return Snapshot(taken_at=104.5, run_dir="attach", ranks=ranks)


def test_a_still_rank_of_its_own_while_its_group_waits_is_the_one_culprit():
    verdicts = analyze(stack_only_job({6: Activity.RUNNING, 7: Activity.COLLECTIVE,
                                       4: Activity.COLLECTIVE}))
    assert [(v.culprit_ranks, v.victim_ranks) for v in verdicts] == [([6], [4, 7])]
    assert verdicts[0].summary.startswith(
        "rank 6 (pp 3/4, tp 0) is running its own code at engine/x.py:6 f6, its stack "
        "unchanged for 4 s")


@pytest.mark.parametrize("doing, moved", [
    ({6: Activity.RUNNING, 7: Activity.COLLECTIVE}, {6}),        # it moves: progress
    ({6: Activity.RUNNING, 7: Activity.COLLECTIVE}, {7}),        # the waiter moved on
    ({6: Activity.COMPILING, 7: Activity.COLLECTIVE}, set()),    # compiling is progress
    ({6: Activity.SLEEPING}, set()),                             # no one waits on it
    ({}, set()),                                                 # every rank idle
])
def test_no_verdict_where_no_one_waits_on_a_still_rank(doing, moved):
    assert analyze(stack_only_job(doing, moved)) == []
