"""One snapshot of a run dir, for tests that read it once."""
from diagnose.core.snapshot import Snapshot
from diagnose.launch.collector import HISTORY, Collector


def collect(run_dir: str, history: int = HISTORY) -> Snapshot:
    return Collector(run_dir, history).snapshot()
