"""diag attach's parts that need no job: how a rank is told from its title or
command line, when a rank moved, the refusal line, and the snapshot a run dir
holds as JSON (read back by diag analyze and diag tui)."""
import json
from dataclasses import asdict

import pytest

from diagnose.analysis import analyze
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
