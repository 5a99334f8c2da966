"""diag launch around real vLLM (0.32, its CPU build) serving a tiny Llama at
tp=2 and tp=2 pp=2 on the CPU, with faults injected through the probe's vLLM
plugin (`--fault`), never by editing vLLM. vLLM compiles its model here as it
does by default, so its TP all-reduce runs inside compiled code, where no
Python is called: the analysis must name the culprit without seeing it."""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import psutil
import pytest

from helpers.collecting import collect
from helpers.vllm_serving import (PROMPT, Server, launch_vllm, serve_command,
                                  vllm_missing)
from helpers.run import detect_bound, free_port

pytestmark = [pytest.mark.skipif(vllm_missing(), reason="real vLLM is not installed "
                                 "here: run ./setup.sh --tests (CI does)"),
              pytest.mark.timeout(900)]
DETECT_S = 5.0
MARK = "vllm.model_executor.models.llama:LlamaModel.forward=forward"
HEALTHY_S = 30.0      # serving under diag with the mark, after the first answer: no verdict


def report(run_dir: Path) -> dict:
    return json.loads((run_dir / "report.json").read_text())


def left_behind(cache: Path) -> list[str]:
    """Processes still running of this session's vLLM servers: the compile cache they
    were given is this session's (a worker's title hides its command, and other vLLM
    processes on the machine are not ours)."""
    ours = str(cache / "vllm")
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if process.environ().get("VLLM_CACHE_ROOT") == ours:
                found.append(" ".join(process.info["cmdline"] or [])[:80])
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
    return found


def shm_files() -> set[str]:
    return set(os.listdir("/dev/shm"))


def assert_nothing_left(cache: Path, shm_before: set[str]) -> None:
    deadline = time.monotonic() + 10
    while (left_behind(cache) or shm_files() - shm_before) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left_behind(cache) == []
    assert shm_files() - shm_before == set()


@pytest.mark.every_release
def test_tp2_rank0_that_never_reaches_its_4th_step_is_named_not_its_peer(tmp_path, checkpoint,
                                                                          cache):
    shm_before = shm_files()
    server, run_dir = launch_vllm(tmp_path, checkpoint, cache, diag=(
        "--on-hang", "kill", "--fault", "rank=0,at=execute_model,step=3,kind=hang"))
    server.wait_ready()
    stop, texts = threading.Event(), []
    server.keep_busy(stop, texts)
    assert server.finish() == 1, server.tail()      # a verdict
    stop.set()
    body = report(run_dir)
    verdict = body["verdicts"][0]
    assert (verdict["kind"], verdict["culprit_ranks"], verdict["victim_ranks"]) == (
        "never_reached", [0], [1]), verdict["summary"]
    assert "never reached execute_model step 3" in verdict["summary"]
    assert "rank 1 and the driver wait on it" in verdict["summary"]
    assert verdict["detected_after_s"] < detect_bound(verdict, DETECT_S), verdict["evidence"]
    assert {v["culprit_ranks"][0] for v in body["verdicts"]} == {0}
    assert set(body["stacks"]) == {"0", "1"}
    assert any("block_forever" in frame for frame in body["stacks"]["0"]["MainThread"])
    assert_nothing_left(cache, shm_before)


def test_tp2_pp2_last_stage_tp1_rank_is_the_only_culprit(tmp_path, checkpoint, cache):
    server, run_dir = launch_vllm(tmp_path, checkpoint, cache, tp=2, pp=2, diag=(
        "--on-hang", "kill", "--fault", "rank=3,at=execute_model,step=1,kind=hang"))
    server.wait_ready()
    stop = threading.Event()
    server.keep_busy(stop, [])
    assert server.finish() == 1, server.tail()      # a verdict
    stop.set()
    verdicts = report(run_dir)["verdicts"]
    assert [v["culprit_ranks"] for v in verdicts] == [[3]], [v["summary"] for v in verdicts]
    assert verdicts[0]["kind"] == "never_reached"
    assert "rank 3 (pp 1/2, tp 1)" in verdicts[0]["summary"]
    assert 2 in verdicts[0]["victim_ranks"]


def test_a_worker_killed_while_serving_is_dead_within_seconds(tmp_path, checkpoint, cache):
    server, run_dir = launch_vllm(tmp_path, checkpoint, cache, diag=("--on-hang", "kill"))
    server.wait_ready()
    stop, texts = threading.Event(), []
    server.keep_busy(stop, texts)
    while len(texts) < 2:
        time.sleep(0.2)
    os.kill(collect(str(run_dir)).ranks[1].identity.pid, 9)
    code = server.finish()
    stop.set()
    verdicts = report(run_dir)["verdicts"]
    assert [(v["kind"], v["culprit_ranks"]) for v in verdicts] == [("dead", [1])], server.tail()
    verdict = verdicts[0]
    # diag ends the run, or vLLM, having lost a worker, shuts itself down first: either
    # way the job crashed (4), whatever code vLLM itself gave.
    assert code == 4, server.tail()
    # vLLM's own signal comes after minutes; the bound is loose so that a loaded
    # machine does not fail it (unloaded, detection takes well under a second).
    assert verdict["detected_after_s"] < 5.0


def wait_for_answers(server: Server, texts: list[str], count: int, timeout: float = 240) -> None:
    """Until `count` requests were answered. The healthy half minute starts at the
    first answer: a server just ready may still be busy (on vLLM 0.11 one logged its
    first answer 4.5 minutes after "startup complete", and in CI the minute after
    ready once served nothing; why is not known)."""
    start = time.monotonic()
    while len(texts) < count:
        assert time.monotonic() - start < timeout, (server.errors[-5:], server.tail())
        time.sleep(0.2)


@pytest.mark.every_release
def test_a_mark_on_the_compiled_forward_keeps_serving_right_and_30_healthy_seconds_are_clean(
        tmp_path, checkpoint, cache):
    shm_before = shm_files()
    plain_port = free_port()
    plain = Server.start(serve_command(checkpoint, plain_port, 2, 1), plain_port, cache, 2,
                         tmp_path / "plain.log", tidy_shm=True)
    plain.wait_ready()
    reference = plain.complete(PROMPT)
    plain.interrupt()
    plain.finish()

    server, run_dir = launch_vllm(tmp_path, checkpoint, cache, diag=("--on-hang", "kill",
                                                                "--mark", MARK))
    server.wait_ready()
    stop, texts = threading.Event(), []
    server.keep_busy(stop, texts)
    wait_for_answers(server, texts, 1)
    time.sleep(HEALTHY_S)
    wait_for_answers(server, texts, 2)     # the first answer and one more: it served on
    stop.set()
    time.sleep(2)
    vllm_pid = json.loads((run_dir / "launch.json").read_text())["pid"]
    # vLLM gone before the SIGINT: diag ended it (--on-hang kill) or it crashed
    assert psutil.pid_exists(vllm_pid), (report(run_dir)["verdicts"], server.process.poll(),
                                         len(texts), server.errors[-5:], server.tail())
    server.interrupt(vllm_pid)
    assert server.finish() == 0, server.tail()
    body = report(run_dir)
    assert body["verdicts"] == []
    # the API server's hook (MPClient.shutdown) said it stopped the job, before it did
    assert (run_dir / "stopping.json").is_file()
    assert set(texts) == {reference}, (
        reference, set(texts), len(texts), server.errors[-5:], server.tail())
    assert any(note.startswith(f"--mark {MARK}: armed") for note in body["notes"]), body["notes"]
    # each row of the hook table that this release has was applied: no "vLLM ..." note
    assert not [note for note in body["notes"] if note.startswith("vLLM ")], body["notes"]
    assert_nothing_left(cache, shm_before)
