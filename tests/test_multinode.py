"""Two "nodes" on one machine: two `python -m engine generate` processes, node 1
headless, tp=2 pp=2 spread over them (ranks 0-1 on the head, 2-3 on node 1)."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

PROMPTS = ["Hello, my name is", "1 2 3"]
ENGINE = [sys.executable, "-m", "engine"]
TP2PP2 = ["--model", "tiny-llama", "-tp", "2", "-pp", "2"]


def _free_port_pair() -> int:
    """A port P with P + 1 free too (the rendezvous and the head's node link)."""
    while True:
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            try:
                second.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue


def _generate_args(max_tokens: int) -> list[str]:
    prompts = [arg for p in PROMPTS for arg in ("--prompt", p)]
    return ["generate", *prompts, "--max-tokens", str(max_tokens), "--ignore-eos", "--json"]


def _start(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(ENGINE + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _start_nodes(max_tokens: int, *extra: str) -> tuple[subprocess.Popen, subprocess.Popen]:
    nodes = ["--nnodes", "2", "--master-port", str(_free_port_pair()), *extra]
    node1 = _start(["generate", *TP2PP2, *nodes, "--node-rank", "1"])
    head = _start([*_generate_args(max_tokens), *TP2PP2, *nodes, "--node-rank", "0"])
    return head, node1


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def _node_workers(node: subprocess.Popen, count: int, timeout: float = 30) -> list[psutil.Process]:
    """The node's worker processes in rank order, once all have started."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workers = [p for p in psutil.Process(node.pid).children()
                   if "spawn_main" in " ".join(p.cmdline())]
        if len(workers) == count:
            return sorted(workers, key=lambda p: (p.create_time(), p.pid))
        time.sleep(0.1)
    raise AssertionError(f"node 1 did not start {count} workers")


def _wait_until_connected(worker: psutil.Process, peers: int = 3, timeout: float = 60) -> None:
    """Until the worker's gloo links to its peers are up, then a little more: the kill
    then lands in warm-up or generation (both must end the same way)."""
    deadline = time.monotonic() + timeout
    while len([c for c in worker.net_connections() if c.status == psutil.CONN_ESTABLISHED]) < peers:
        assert time.monotonic() < deadline, "the worker never connected to its peers"
        time.sleep(0.05)
    time.sleep(2)


def _shm_mapped(procs: list[psutil.Process]) -> set[str]:
    """The /dev/shm segments these processes map (their broadcast rings)."""
    return {m.path for p in procs for m in p.memory_maps() if m.path.startswith("/dev/shm/")}


def _assert_all_gone(procs: list[psutil.Process], segments: set[str]) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(
            p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in procs):
        time.sleep(0.1)
    assert not [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert segments and not [s for s in segments if os.path.exists(s)]


def _family(*roots: subprocess.Popen) -> list[psutil.Process]:
    procs = []
    for root in roots:
        proc = psutil.Process(root.pid)
        procs += [proc, *proc.children(recursive=True)]
    return procs


def test_tp2_pp2_over_two_nodes_matches_one_rank():
    single = subprocess.run(ENGINE + _generate_args(10), capture_output=True, text=True,
                            timeout=60)
    assert single.returncode == 0, single.stderr
    head, node1 = _start_nodes(10)
    head_out, head_err = head.communicate(timeout=60)
    node_out, node_err = node1.communicate(timeout=30)
    assert head.returncode == 0, head_err
    assert node1.returncode == 0, node_err
    assert node_out == ""
    assert "node 1 (ranks 2-3) joined the head" in node_err
    rows = [json.loads(line) for line in head_out.splitlines()]
    assert [r["token_ids"] for r in rows] == \
        [json.loads(line)["token_ids"] for line in single.stdout.splitlines()]
    assert all(len(r["token_ids"]) == 10 for r in rows)


def test_killed_worker_on_node_1_ends_both_nodes():
    head, node1 = _start_nodes(10_000)
    try:
        rank2, rank3 = _node_workers(node1, 2)
        _wait_until_connected(rank3)
        family, segments = _family(head, node1), _shm_mapped(_family(head, node1))
        rank3.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        _, head_err = head.communicate(timeout=20)
        assert time.monotonic() - killed_at < 10
        _, node_err = node1.communicate(timeout=10)
    finally:
        head.kill(), node1.kill()
    expected = "error: rank 3 (pp 1/2, tp 1) was killed by signal SIGKILL"
    assert head.returncode != 0 and _error_lines(head_err) == [expected], head_err
    assert node1.returncode != 0 and _error_lines(node_err) == [expected], node_err
    _assert_all_gone(family, segments)


def test_sigterm_on_node_1_stops_it_and_the_head_names_the_node():
    head, node1 = _start_nodes(10_000)
    try:
        _wait_until_connected(_node_workers(node1, 2)[1])
        family, segments = _family(head, node1), _shm_mapped(_family(head, node1))
        node1.send_signal(signal.SIGTERM)
        _, node_err = node1.communicate(timeout=10)
        _, head_err = head.communicate(timeout=10)
    finally:
        head.kill(), node1.kill()
    assert node1.returncode == 128 + signal.SIGTERM, node_err
    assert head.returncode != 0
    assert _error_lines(head_err) == ["error: node 1 (ranks 2-3) lost: the connection closed"], head_err
    _assert_all_gone(family, segments)


def test_node_that_never_joins_fails_the_head():
    port = str(_free_port_pair())
    started = time.monotonic()
    proc = subprocess.run(ENGINE + _generate_args(4) + TP2PP2 + [
        "--nnodes", "2", "--master-port", port, "--node-timeout", "1"],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [
        f"error: node 1 did not join within 1 s (--node-timeout); start each with --nnodes 2 "
        f"--node-rank N --master-addr 127.0.0.1 --master-port {port}"]
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_headless_node_without_a_head_fails(command):
    port = _free_port_pair()
    proc = subprocess.run(ENGINE + [command, *TP2PP2, "--nnodes", "2", "--node-rank", "1",
                                    "--master-port", str(port), "--node-timeout", "1"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"error: no head answered at 127.0.0.1:{port + 1} within 1 s (--node-timeout)"]


def test_mismatched_node_is_refused_on_both_sides():
    port = str(_free_port_pair())
    node1 = _start(["generate", "--model", "tiny-llama", "-tp", "2", "--nnodes", "2",
                    "--node-rank", "1", "--master-port", port])
    head = _start(_generate_args(4) + TP2PP2 + ["--nnodes", "2", "--master-port", port])
    try:
        _, head_err = head.communicate(timeout=60)
        _, node_err = node1.communicate(timeout=10)
    finally:
        head.kill(), node1.kill()
    expected = ["error: node 1 was started with tp=2 pp=1 nnodes=2 model=tiny-llama, "
                "the head with tp=2 pp=2 nnodes=2 model=tiny-llama"]
    assert head.returncode != 0 and head_err.strip().splitlines() == expected, head_err
    assert node1.returncode != 0 and node_err.strip().splitlines() == expected, node_err


@pytest.mark.parametrize("argv,message", [
    (["--nnodes", "2", "--node-rank", "2", "--master-port", "29500"],
     "--node-rank must be in 0..1 (--nnodes 2), got 2"),
    (["--nnodes", "3", "--master-port", "29500"],
     "--nnodes 3 does not divide the 4 ranks (tp 2 x pp 2)"),
    (["--nnodes", "2"], "--master-port is required with --nnodes > 1"),
    (["--nnodes", "2", "--node-rank", "1"], "--master-port is required with --nnodes > 1"),
])
def test_bad_node_flags_are_one_line_errors(argv, message):
    proc = subprocess.run(ENGINE + _generate_args(4) + TP2PP2 + argv, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], proc.stderr
