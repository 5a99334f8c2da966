"""diag says what it did: a real torchrun job that `--on-hang kill` ends has
diag's one line where the kill happened, and `diag logs` on the capture (the
terminal's, and output.log) names the hang from diag's own lines, not the
SignalException traceback that torchrun prints when diag's SIGTERM reaches it
(or the ChildFailedError it raises when it sees its ranks end first)."""
import json
import os
import subprocess
import sys

import pytest

from helpers.run import PROGRAMS, REPO, diag, free_port, left_behind

pytestmark = pytest.mark.e2e

ENDED = ("diag: --- diag ended the job here (--on-hang kill: collective_missing_peers, "
         "culprit rank 1) ---")


def diag_logs(path) -> tuple[int, list[dict]]:
    done = diag("logs", path, "--json")
    return done.returncode, json.loads(done.stdout)["findings"]


def test_a_killed_torchrun_job_is_read_as_the_hang_diag_found(tmp_path):
    run_dir, capture = tmp_path / "run", tmp_path / "capture.log"
    command = [sys.executable, "-m", "diagnose.cli", "launch", "--run-dir", str(run_dir),
               "--on-hang", "kill", "--", sys.executable, "-m", "torch.distributed.run",
               "--nproc-per-node", "2", "--monitor-interval", "0.5",
               "--master-port", str(free_port()), os.path.join(PROGRAMS, "dp_train.py")]
    with open(capture, "wb") as sink:      # as `diag launch ... 2>&1 | tee capture.log`
        code = subprocess.run(command, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT,
                              env=dict(os.environ, TOY_FAULT="skip_allreduce:1:3"),
                              timeout=120).returncode
    assert not left_behind(run_dir)
    assert code == 1, capture.read_text()[-3000:]      # a verdict
    text = capture.read_text()
    assert text.count(ENDED) == 1
    # torchrun's traceback came after: diag's SIGTERM reached it in its monitor loop,
    # or it saw its ranks end first (tests/fixtures/logs: torchrun_ended_by_diag_...)
    said_after = text.split(ENDED, 1)[1]
    assert "got signal: 15" in said_after or "ChildFailedError" in said_after, said_after
    for path in (capture, run_dir / "output.log"):
        code, findings = diag_logs(path)
        assert code == 1
        first = findings[0]
        assert (first["kind"], first["severity"], first["rank"]) == ("diag_verdict", "hang", 1)
        assert first["summary"].startswith("diag launch: [collective_missing_peers] rank 1 ")
        assert not [f for f in findings if "SignalException" in f["summary"]
                    and f["severity"] != "note"]
        stopped = [f for f in findings if f["kind"] == "after_shutdown"]
        assert len(stopped) == 1, findings
        assert ("SignalException" in stopped[0]["summary"]
                or "ChildFailedError" in stopped[0]["summary"]), stopped
