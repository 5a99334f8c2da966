"""Flight Recorder dumps of a TP x PP x DP serving job whose rings wrapped, with
each kind of planted culprit: diag analyze names that rank alone. The dumps come
from diagnose/offline/synth_fr_serving.py, in torch's format (torchfrtrace reads
them too: benchmarks/fr_vs_torchfrtrace.py)."""
import pickle

import pytest

from diagnose.analysis import analyze
from diagnose.analysis.thresholds import Thresholds
from diagnose.offline.flight_recorder import read_fr_dir
from diagnose.offline.synth import SynthError
from diagnose.offline.synth_fr_serving import FAULTS, Layout, write_serving_fr_dumps

pytestmark = pytest.mark.unit

LAYOUT = Layout(tp=4, pp=4, dp=2)


def judged(path):
    """As diag analyze judges dumps: a post-mortem, where no stall limit applies."""
    return analyze(read_fr_dir(str(path), "nccl_trace_rank_").snapshot, Thresholds(stall_s=0.0))


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("culprit", [21, 4])
def test_the_planted_rank_is_the_one_culprit(tmp_path, fault, culprit):
    write_serving_fr_dumps(str(tmp_path), LAYOUT, culprit, fault, entries=32)
    verdicts = judged(tmp_path)
    assert [verdict.culprit_ranks for verdict in verdicts] == [[culprit]]


def test_a_stalled_send_is_not_blamed_on_the_peer_that_waits_for_it(tmp_path):
    """The next stage's peer waits in its recv while its TP group waits for it in
    an all_reduce: it is missing from that all_reduce, but it is a victim."""
    write_serving_fr_dumps(str(tmp_path), LAYOUT, 21, "stalled_send", entries=32)
    verdict, = judged(tmp_path)
    assert verdict.culprit_ranks == [21]
    assert 25 in verdict.victim_ranks


def test_every_ring_wrapped_and_holds_torchs_fields(tmp_path):
    paths = write_serving_fr_dumps(str(tmp_path), LAYOUT, 21, "missing", entries=32)
    with open(paths[0], "rb") as source:
        dump = pickle.load(source)
    assert len(dump["entries"]) == 32 and dump["entries"][0]["record_id"] > 0
    assert {"tp0", "pp0"} == {group["desc"] for group in dump["pg_config"].values()}


@pytest.mark.parametrize("culprit,fault,says", [
    (64, "missing", "not a rank"), (0, "explode", "unknown fault"),
    (28, "stalled_send", "no send to stall")])
def test_a_plant_that_cannot_be_is_refused(tmp_path, culprit, fault, says):
    with pytest.raises(SynthError, match=says):
        write_serving_fr_dumps(str(tmp_path), LAYOUT, culprit, fault)
