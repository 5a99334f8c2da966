"""One snapshot of a run dir, for tests that read it once, and a rank's phase in it."""
from diagnose.core.snapshot import Snapshot
from diagnose.launch.collector import HISTORY, Collector


def collect(run_dir: str, history: int = HISTORY) -> Snapshot:
    return Collector(run_dir, history).snapshot()


def rank_in_phase(run_dir, rank: int, name: str, step=None):
    """The rank's state once its innermost open phase is (name, step), else None."""
    state = collect(str(run_dir)).ranks.get(rank)
    if state and state.phase and (state.phase.name, state.phase.step) == (name, step):
        return state
    return None
