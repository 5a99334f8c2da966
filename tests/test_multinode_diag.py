"""Multi-node diag launch: two "nodes" on this machine, each a diag launch with
its own run dir and node rank, the second reporting to the head over TCP.
The workloads are real two-node jobs, 2 ranks per node: the engine at tp=2
pp=2 (ranks 2-3, the last stage, on node 1), and a torchrun training job."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from helpers.run import PROGRAMS, REPO, diag, free_port, left_behind

TOKEN = "test-token-4f1c"
ENGINE_TOKEN = "engine-token-9d2e"   # the engine's own node link
DETECT_S = 5.0


def torchrun_job(node_rank, master_port):
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
            "--node-rank", str(node_rank), "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
            "--master-port", str(master_port), "--monitor-interval", "0.5",
            os.path.join(PROGRAMS, "dp_train.py")]


def engine_job(node_rank, master_port):
    command = [sys.executable, "-m", "engine", "generate", "--model", "tiny-llama", "-tp", "2",
               "-pp", "2", "--nnodes", "2", "--node-rank", str(node_rank),
               "--master-port", str(master_port)]
    if node_rank == 0:
        command += ["--prompt", "The head names the culprit", "--max-tokens", "32"]
    return command


class TwoNodes:
    """The head (node 0) and node 1, each `diag launch [node flags] -- job`."""

    def __init__(self, tmp_path, job=torchrun_job, toy_fault="", toy_steps=40,
                 node1_token=TOKEN, node1_flags=()):
        self.head_dir, self.node_dir = tmp_path / "head", tmp_path / "node1"
        self.report = tmp_path / "head-report.json"
        master, listen = free_port(consecutive=2), free_port()
        env = dict(os.environ, TOY_FAULT=toy_fault, TOY_STEPS=str(toy_steps),
                   DIAG_NODE_TOKEN=TOKEN, ENGINE_NODE_TOKEN=ENGINE_TOKEN)
        self.head = self._start(0, ["--listen", f"127.0.0.1:{listen}", "--on-hang", "kill",
                                    "-o", str(self.report)], job(0, master), env)
        env = dict(env, DIAG_NODE_TOKEN=node1_token)
        self.node1 = self._start(1, ["--head", f"127.0.0.1:{listen}", *node1_flags],
                                 job(1, master), env)

    def _start(self, node_rank, flags, job, env):
        run_dir = self.head_dir if node_rank == 0 else self.node_dir
        command = [sys.executable, "-m", "diagnose.cli", "launch", "--run-dir", str(run_dir),
                   "--nnodes", "2", "--node-rank", str(node_rank), *flags, "--", *job]
        return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def wait(self, timeout=90):
        outputs = [proc.communicate(timeout=timeout) for proc in (self.head, self.node1)]
        return [(proc.returncode, err) for proc, (_, err) in zip((self.head, self.node1), outputs)]

    def head_report(self):
        return json.loads(self.report.read_text())

    def ranks_node1_reported(self) -> list[str]:
        try:
            return sorted(json.loads((self.head_dir / "node-1.json").read_text())["ranks"])
        except (OSError, ValueError):
            return []

    def kill(self):
        """Stop both launchers as a user would (SIGTERM: each stops its command)."""
        for proc in (self.head, self.node1):
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.terminate()
                try:
                    proc.communicate(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.communicate()

    def assert_nothing_left(self):
        assert not left_behind(self.head_dir) and not left_behind(self.node_dir)


@pytest.fixture
def two_nodes(tmp_path):
    started = []

    def start(**kwargs):
        started.append(TwoNodes(tmp_path, **kwargs))
        return started[-1]
    yield start
    for nodes in started:
        nodes.kill()


def test_engine_across_two_nodes_the_head_names_rank_3_on_node_1(two_nodes):
    nodes = two_nodes(job=engine_job,
                      node1_flags=["--fault", "rank=3,at=execute_model,step=0,kind=hang"])
    (head_code, head_err), (node_code, node_err) = nodes.wait()
    assert (head_code, node_code) == (1, 1), head_err + node_err
    verdict = nodes.head_report()["verdicts"][0]
    assert (verdict["kind"], verdict["culprit_ranks"]) == ("never_reached", [3])
    assert 2 in verdict["victim_ranks"] and verdict["detected_after_s"] <= DETECT_S
    assert {"0", "1", "2", "3"} <= set(nodes.head_report()["stacks"])
    nodes.assert_nothing_left()


def test_torchrun_across_two_nodes_the_head_names_rank_3(two_nodes):
    nodes = two_nodes(toy_fault="skip_allreduce:3:5")
    (head_code, head_err), (node_code, node_err) = nodes.wait()
    assert (head_code, node_code) == (1, 1), head_err + node_err
    verdict = nodes.head_report()["verdicts"][0]
    assert (verdict["kind"], verdict["culprit_ranks"]) == ("collective_missing_peers", [3])
    assert verdict["victim_ranks"] == [0, 1, 2]
    assert verdict["detected_after_s"] <= DETECT_S
    assert set(nodes.head_report()["stacks"]) == {"0", "1", "2", "3"}  # node 1's came over TCP
    assert "rank 3 never joined" in node_err   # node 1 shows the head's verdict
    nodes.assert_nothing_left()
    again = diag("analyze", nodes.head_dir, "--json")
    body = json.loads(again.stdout)
    assert [(v["kind"], v["culprit_ranks"]) for v in body["verdicts"]][:1] == [
        ("collective_missing_peers", [3])]


def test_a_silent_agent_is_node_lost_not_a_hang_of_its_ranks(two_nodes):
    nodes = two_nodes(toy_steps=600)   # about 30 s of healthy training
    deadline = time.monotonic() + 60
    while nodes.ranks_node1_reported() != ["2", "3"]:
        assert time.monotonic() < deadline, "node 1 never reported its ranks to the head"
        time.sleep(0.2)
    os.kill(nodes.node1.pid, signal.SIGSTOP)   # the agent vanishes; its ranks train on
    stopped_at = time.monotonic()
    nodes.head.wait(timeout=60)
    assert nodes.head.returncode == 1
    assert time.monotonic() - stopped_at < 3.0 + DETECT_S + 10.0
    verdicts = nodes.head_report()["verdicts"]
    assert verdicts[0]["kind"] == "node_lost" and verdicts[0]["culprit_ranks"] == [2, 3]
    assert "node 1" in verdicts[0]["summary"]
    assert not any({2, 3} & set(v["culprit_ranks"]) for v in verdicts[1:])
    os.kill(nodes.node1.pid, signal.SIGCONT)   # back, its head gone: its user stops it
    nodes.node1.terminate()
    nodes.node1.communicate(timeout=60)
    nodes.assert_nothing_left()


def test_a_node_with_the_wrong_token_is_refused(two_nodes):
    nodes = two_nodes(node1_token="not-the-token")
    _, err = nodes.node1.communicate(timeout=60)
    assert nodes.node1.returncode == 2
    assert err.strip().splitlines()[-1] == "diag: error: node 1: the head refused the token"
    nodes.kill()
    nodes.assert_nothing_left()


@pytest.mark.parametrize("flags, message", [
    (["--nnodes", "2"], "node 0 is the head of a multi-node launch: give --listen HOST:PORT"),
    (["--nnodes", "2", "--node-rank", "1"], "node 1 reports to the head: give --head HOST:PORT"),
    (["--nnodes", "2", "--node-rank", "2", "--head", "h:1"], "--node-rank must be in 0..1"),
    (["--listen", "127.0.0.1:5000"], "--listen and --head are for multi-node launches"),
    (["--nnodes", "2", "--listen", "nohost"], "--listen must be HOST:PORT, not 'nohost'"),
    (["--nnodes", "two"], "expected a whole number, not 'two'"),
])
def test_bad_node_flags_are_one_line(tmp_path, flags, message):
    done = diag("launch", "--run-dir", tmp_path / "run", *flags, "--", "true",
                env={"DIAG_NODE_TOKEN": TOKEN}, timeout=30)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and message in done.stderr


def test_a_multi_node_launch_needs_the_token(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DIAG_NODE_TOKEN"}
    done = subprocess.run([sys.executable, "-m", "diagnose.cli", "launch", "--run-dir",
                           str(tmp_path / "run"), "--nnodes", "2", "--listen",
                           f"127.0.0.1:{free_port()}", "--", "true"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "DIAG_NODE_TOKEN" in done.stderr
