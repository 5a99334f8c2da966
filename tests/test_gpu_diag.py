"""GPU diagnostics: a CUDA graph's replays traced one collective at a time with the
device's progress, the relaunch of a rank that failed a device-side assert, and
gpu_stuck inside a decode replay at tp=2 (on NCCL). The GPU tests skip without
CUDA; the process-group timeout knob they use is checked everywhere."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from helpers.collecting import collect
from helpers.run import launch, wait_for
from engine.communicator import DEFAULT_TIMEOUT_S, TIMEOUT_VAR, timeout_from_env

REPO = Path(__file__).resolve().parents[1]
NO_NVLS = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
           "NVSHMEM_DISABLE_NVLS": "1"}


def needs_gpus(count: int):
    return pytest.mark.skipif(
        torch.cuda.device_count() < count,
        reason=f"needs {count} CUDA GPU(s): CUDA graphs, device events and NCCL run only there")


def test_the_process_group_timeout_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(TIMEOUT_VAR, raising=False)
    assert timeout_from_env() == DEFAULT_TIMEOUT_S
    monkeypatch.setenv(TIMEOUT_VAR, "20")
    assert timeout_from_env() == 20.0
    for bad in ("soon", "0", "-5"):
        monkeypatch.setenv(TIMEOUT_VAR, bad)
        with pytest.raises(ValueError, match=f"{TIMEOUT_VAR} must be seconds > 0, not '{bad}'"):
            timeout_from_env()


GRAPH_CHILD = """
    import sys, time, torch
    from diagnose import probe
    from kernels import faults

    probe.init("worker", rank=0, world_size=1, device="cuda:0")
    torch.cuda.set_device(0)
    x = torch.ones(64, device="cuda")

    def step():
        with probe.collective("tp0", "all_reduce", [x]):
            x.mul_(1.0)                          # stands for the all_reduce
        x.add_(1.0)

    step()                                       # eager: seq 0
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with probe.graph_capture() as captured, torch.cuda.graph(graph):
        step()
    with probe.phase("execute_model", step=0):
        for _ in range(3):                       # seqs 1-3
            with probe.graph_replay(captured):
                graph.replay()
    torch.cuda.synchronize()
    flag = faults.spin_flag()
    with probe.phase("execute_model", step=1):
        faults.gpu_spin(flag)                    # the GPU stops before the next replay
        with probe.graph_replay(captured):       # seq 4
            graph.replay()
        print("spinning", flush=True)
        sys.stdin.readline()
        faults.release(flag)
        torch.cuda.synchronize()
    with probe.phase("execute_model", step=2):
        time.sleep(60)
"""


@needs_gpus(1)
def test_each_replay_records_its_collectives_with_the_devices_progress(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(GRAPH_CHILD))
    run_dir = tmp_path / "run"
    child = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO), "DIAG_RUN_DIR": str(run_dir)})
    try:
        assert child.stdout.readline().strip() == "spinning"
        time.sleep(0.5)                          # a few heartbeats
        records = collect(str(run_dir)).ranks[0].collectives
        assert [(r.seq, r.state, r.device) for r in records] == [
            (seq, "completed", True) for seq in range(5)]
        assert {r.site for r in records} == {records[0].site}   # as at capture
        assert all(r.t_device_done is not None for r in records[:4])
        assert records[4].t_device_start is None and records[4].t_device_done is None
        child.stdin.write("release\n")
        child.stdin.flush()

        def replay_finished():
            state = collect(str(run_dir)).ranks[0]
            return (state.phase is not None and state.phase.step == 2
                    and state.collectives[-1].t_device_done is not None)
        wait_for(replay_finished, timeout=60.0, what="the replay to finish on the GPU")
    finally:
        child.kill()
        child.wait()


def launch_gpu(tmp_path: Path, fault: str, engine_flags: list[str], *flags: str) -> dict:
    engine = [sys.executable, "-m", "engine", "generate", "--model", "tiny-llama", "-tp", "2",
              "--device", "cuda", "--dtype", "bfloat16", "--ignore-eos", "--max-tokens", "32",
              "--prompt", "Where does the GPU stop?", *engine_flags]
    return launch(tmp_path, engine, "--fault", fault, *flags, timeout=240, env=NO_NVLS).body()


@needs_gpus(2)
def test_a_device_assert_is_traced_to_its_kernel_and_call_site_by_the_relaunch(tmp_path):
    body = launch_gpu(tmp_path, "rank=1,at=forward,step=4,kind=device_assert", ["--enforce-eager"],
                  "--relaunch-on-cuda-error")
    assert [(v["kind"], v["culprit_ranks"]) for v in body["verdicts"]][:1] == [("dead", [1])]
    error = body["cuda_error"]
    surfaced, raised = error["first_run"], error["launch_blocking_run"]
    assert raised["site"].startswith("kernels/faults.py:"), (raised, body["stderr"][-3000:])
    assert raised["site"].endswith(" device_assert")
    assert "_assert_kernel[" in raised["code"] and error["kernel"]
    assert surfaced["site"] != raised["site"]           # the first run: a later call


@needs_gpus(2)
def test_a_gpu_spinning_before_a_decode_replay_is_gpu_stuck_inside_the_replay(tmp_path):
    body = launch_gpu(tmp_path, "rank=1,at=forward,step=4,kind=gpu_spin", [])   # CUDA graphs on
    assert [(v["kind"], v["culprit_ranks"]) for v in body["verdicts"]][:1] == [
        ("gpu_stuck", [1])], body["stderr"][-3000:]
    verdict = body["verdicts"][0]
    stuck = verdict["evidence"]["device"]["not_reached"]
    assert stuck["op"] == "all_reduce"                       # in the graph: a layer's or the embedding's
    assert stuck["site"].startswith(("model/linear.py", "model/embed_head.py")), stuck["site"]
    assert verdict["victim_ranks"] == [0]
    assert verdict["detected_after_s"] <= 5
