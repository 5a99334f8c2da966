"""The rank layout of a vLLM job, from the sizes in vLLM's parallel config and in
vLLM's order (TP fastest, then prefill-context parallel, then PP), the name
vLLM gives each worker (its process title and log prefix), and which configs
are a DP rank's (not traced)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from diagnose.core.layout import Layout
from diagnose.core.snapshot import Identity
from diagnose.probe.vllm import data_parallel, dp_rank

pytestmark = pytest.mark.unit


def test_tp_pp_is_as_before():
    layout = Layout(2, 2)
    assert [layout.place(rank) for rank in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert layout.groups() == {"tp0": [0, 1], "tp1": [2, 3], "pp": [0, 1, 2, 3]}
    assert [layout.vllm_name(rank) for rank in range(4)] == [
        "Worker_PP0_TP0", "Worker_PP0_TP1", "Worker_PP1_TP0", "Worker_PP1_TP1"]
    assert Layout(2, 1).vllm_name(1) == "Worker_TP1" and Layout(1, 1).vllm_name(0) == "Worker"


def test_prefill_context_parallel_sits_between_tp_and_pp():
    layout = Layout(tp_size=2, pp_size=2, pcp_size=2)
    assert layout.world_size == 8
    assert [(layout.place(r), layout.pcp_rank(r)) for r in (0, 3, 5, 6)] == [
        ((0, 0), 0), ((0, 1), 1), ((1, 1), 0), ((1, 0), 1)]
    assert layout.groups() == {"tp0.0": [0, 1], "tp0.1": [2, 3], "tp1.0": [4, 5],
                               "tp1.1": [6, 7], "pp": list(range(8))}
    assert layout.tp_group(6) == "tp1.1"
    assert layout.vllm_name(6) == "Worker_PP1_PCP1_TP0"
    assert all(layout.rank(*layout.place(r)[:1], layout.place(r)[1], layout.pcp_rank(r)) == r
               for r in range(8))


def test_a_rank_is_named_as_vllm_names_it_where_pp_and_tp_do_not_say_it_all():
    base = dict(role="worker", rank=6, world_size=8, tp_rank=0, tp_size=2, pp_rank=1,
                pp_size=2, host="h", pid=1, device="cpu")
    assert Identity(**base).name == "rank 6 (pp 1/2, tp 0)"
    assert Identity(**base, label="Worker_PP1_TP0").name == "rank 6 (pp 1/2, tp 0)"
    assert Identity(**base, label="Worker_PP1_PCP1_TP0").name == "rank 6 (Worker_PP1_PCP1_TP0)"


def test_a_dp_ranks_parallel_config_is_told_from_a_plain_ones():
    """The fields of vLLM's ParallelConfig (the project's venv has no vLLM): 0.32
    resets a dense model's DP size to 1 and its data_parallel_rank to 0 in each
    engine core and keeps the rank in data_parallel_index; 0.11 and a MoE model
    keep the DP size; releases before 0.32 have no data_parallel_index."""
    plain = SimpleNamespace(data_parallel_size=1, data_parallel_rank=0, data_parallel_index=0)
    dense_dp1 = SimpleNamespace(data_parallel_size=1, data_parallel_rank=0, data_parallel_index=1)
    moe_dp0 = SimpleNamespace(data_parallel_size=2, data_parallel_rank=0, data_parallel_index=0)
    older_dp1 = SimpleNamespace(data_parallel_size=2, data_parallel_rank=1)
    configs = [plain, dense_dp1, moe_dp0, older_dp1, None]
    assert [data_parallel(config) for config in configs] == [False, True, True, True, False]
    assert [dp_rank(config) for config in configs] == [0, 1, 0, 1, 0]
