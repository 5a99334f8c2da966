"""Two "nodes" on one machine: two `python -m engine generate` processes, node 1
headless, tp=2 pp=2 spread over them (ranks 0-1 on the head, 2-3 on node 1); and
what the head's node link does with connections that are no node of the run."""
import json
import os
import pickle
import re
import shlex
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import IO

import psutil
import pytest

from engine.executor.node import HANDSHAKE_TIMEOUT_S, TOKEN_VAR
from helpers.live_log import text_so_far
from helpers.peers import until_closed
from helpers.run import free_port, wait_for

PROMPTS = ["Hello, my name is", "1 2 3"]
ENGINE = [sys.executable, "-m", "engine"]
TP2PP2 = ["--model", "tiny-llama", "-tp", "2", "-pp", "2"]
TOKEN = "engine-test-token"
NO_TOKEN_ERROR = (f"error: a multi-node run needs the shared token in {TOKEN_VAR} "
                  f"(8 characters or more), the same on every node")


def _generate_args(max_tokens: int) -> list[str]:
    prompts = [arg for p in PROMPTS for arg in ("--prompt", p)]
    return ["generate", *prompts, "--max-tokens", str(max_tokens), "--ignore-eos", "--json"]


def _env(token: str | None = TOKEN) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != TOKEN_VAR}
    return env if token is None else dict(env, **{TOKEN_VAR: token})


def _start(argv: list[str], token: str | None = TOKEN) -> subprocess.Popen:
    return subprocess.Popen(ENGINE + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env(token))


def _start_nodes(max_tokens: int, *extra: str,
                 port: int | None = None) -> tuple[subprocess.Popen, subprocess.Popen]:
    nodes = ["--nnodes", "2", "--master-port", str(port or free_port(consecutive=2)), *extra]
    node1 = _start(["generate", *TP2PP2, *nodes, "--node-rank", "1"])
    head = _start([*_generate_args(max_tokens), *TP2PP2, *nodes, "--node-rank", "0"])
    return head, node1


def _store_addresses(head: subprocess.Popen, port: int, timeout: float = 60) -> set[str]:
    """The addresses the rendezvous's TCPStore (rank 0's, on the head) listens on,
    once it does: after node 1 joined, while the ranks meet."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and head.poll() is None:
        addresses = set()
        try:
            for proc in _family(head):
                addresses |= {c.laddr.ip for c in proc.net_connections("tcp")
                              if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
        except psutil.Error:
            continue      # a process that ended meanwhile
        if addresses:
            return addresses
        time.sleep(0.02)
    raise AssertionError("the head's rank 0 never listened on the rendezvous port")


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


def _at_work(worker: psutil.Process, *nodes: subprocess.Popen,
             peers: int = 3) -> tuple[list[psutil.Process], set[str]]:
    """The nodes' processes and the shared memory they map, once the worker's gloo
    links to its peers are up and the nodes map their broadcast rings: a kill then
    lands in warm-up or generation (both must end the same way)."""
    wait_for(lambda: len([c for c in worker.net_connections()
                          if c.status == psutil.CONN_ESTABLISHED]) >= peers,
             60, what="the worker's links to its peers")
    return wait_for(lambda: _mapped_family(*nodes), 60, what="the nodes' broadcast rings")


def _mapped_family(*nodes: subprocess.Popen) -> tuple[list[psutil.Process], set[str]] | None:
    family = _family(*nodes)
    segments = _shm_mapped(family)
    return (family, segments) if segments else None


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
                            timeout=60, env=_env(token=None))   # one node needs no token
    assert single.returncode == 0, single.stderr
    port = free_port(consecutive=2)
    head, node1 = _start_nodes(10, port=port)
    store = _store_addresses(head, port)
    head_out, head_err = head.communicate(timeout=60)
    node_out, node_err = node1.communicate(timeout=30)
    assert store == {"127.0.0.1"}        # --master-addr's default; torch's own listens on all
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
        family, segments = _at_work(rank3, head, node1)
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
        family, segments = _at_work(_node_workers(node1, 2)[1], head, node1)
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
    port = str(free_port(consecutive=2))
    started = time.monotonic()
    proc = subprocess.run(ENGINE + _generate_args(4) + TP2PP2 + [
        "--nnodes", "2", "--master-port", port, "--node-timeout", "1"],
        capture_output=True, text=True, timeout=60, env=_env())
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [
        f"error: node 1 did not join within 1 s (--node-timeout); start each with --nnodes 2 "
        f"--node-rank N --master-addr 127.0.0.1 --master-port {port}"]
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_headless_node_without_a_head_fails(command):
    port = free_port(consecutive=2)
    proc = subprocess.run(ENGINE + [command, "--model", "tiny-llama", *TP2PP2, "--nnodes", "2",
                                    "--node-rank", "1", "--master-port", str(port), "--node-timeout", "1"],
                          capture_output=True, text=True, timeout=60, env=_env())
    assert proc.returncode != 0 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"error: no head answered at 127.0.0.1:{port + 1} within 1 s (--node-timeout)"]


def test_mismatched_node_is_refused_on_both_sides():
    port = str(free_port(consecutive=2))
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


@pytest.mark.parametrize("node_rank,token", [(0, None), (1, "short")])
def test_a_multi_node_run_needs_the_token(node_rank, token):
    argv = _generate_args(4) if node_rank == 0 else ["generate"]
    proc = subprocess.run(ENGINE + argv + TP2PP2 + [
        "--nnodes", "2", "--node-rank", str(node_rank), "--master-port", str(free_port(consecutive=2))],
        capture_output=True, text=True, timeout=60, env=_env(token))
    assert proc.returncode != 0 and proc.stderr.strip().splitlines() == [NO_TOKEN_ERROR]


# -- connections to the head's node link that are no node of the run ----------------------

REFUSED = "the head refused a node link from 127.0.0.1:"
MORE = re.compile(r" \(and \d+ more refused in the last \d+ s\)$")   # the refusals left out
REFUSAL_S = 1.1     # refusals are one line a second at most: attacks this far apart get one each


@dataclass
class WaitingHead:
    """A head still waiting for node 1; its stderr goes to a file, readable meanwhile."""
    proc: subprocess.Popen
    port: int          # the rendezvous; the node link is port + 1
    log: IO[bytes]

    def stderr(self) -> str:
        return text_so_far(self.log)

    def refusals(self) -> list[str]:
        return [MORE.sub("", line) for line in self.stderr().splitlines()
                if line.startswith(REFUSED)]

    def new_refusals(self, before: int, count: int) -> list[str]:
        """The `count` refusals after the first `before`, once the head has written them."""
        deadline = time.monotonic() + 10
        while len(self.refusals()) < before + count and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.refusals()[before:]

    def listening(self) -> bool:
        return any(c.status == psutil.CONN_LISTEN and c.laddr.port == self.port + 1
                   for c in psutil.Process(self.proc.pid).net_connections("tcp"))

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port + 1), timeout=10)

    def assert_still_waiting(self) -> None:
        assert self.proc.poll() is None and self.listening(), self.stderr()


@pytest.fixture(scope="module")
def marker(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("attack") / "unpickled")


@pytest.fixture(scope="module")
def waiting_head(marker):
    """One head for every attack; at the end node 1 joins, and the run must end as if
    nothing had happened."""
    port = free_port(consecutive=2)
    log = tempfile.TemporaryFile()
    head = _waiting_head(port, log, node_timeout=120)
    proc = head.proc
    yield head
    node1 = _start(["generate", *TP2PP2, "--nnodes", "2", "--master-port", str(port),
                    "--node-rank", "1"])
    try:
        out, _ = proc.communicate(timeout=90)
        node1.communicate(timeout=30)
    finally:
        proc.kill(), node1.kill()
        log.close()
    assert (proc.returncode, node1.returncode) == (0, 0)
    rows = [json.loads(line) for line in out.splitlines()]
    assert [len(r["token_ids"]) for r in rows] == [4, 4]
    assert not os.path.exists(marker)


class _Touch:
    """Unpickling it runs `touch path`: the payload of an attack on a pickle link."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(self.path)}",)


def test_a_crafted_pickle_is_never_unpickled(waiting_head, marker):
    payload = pickle.dumps(("join", 1, _Touch(marker)))
    before = len(waiting_head.refusals())
    for length in (struct.pack("!Q", len(payload)),    # how the link used to frame it
                   struct.pack("!I", len(payload))):   # how it frames messages now
        time.sleep(REFUSAL_S)
        with waiting_head.connect() as sock:
            sock.sendall(length + payload)
            assert until_closed(sock) < 2
    refusals = waiting_head.new_refusals(before, 2)
    assert len(refusals) == 2 and all(r.endswith(f": wrong {TOKEN_VAR}") for r in refusals)
    assert not os.path.exists(marker)
    waiting_head.assert_still_waiting()


def test_an_http_request_is_dropped_and_memory_stays_bounded(waiting_head):
    head = psutil.Process(waiting_head.proc.pid)
    rss_before = head.memory_info().rss
    before = len(waiting_head.refusals())
    for request in (b"GET / HTTP/1.1\r\nHost: head\r\n\r\n",
                    struct.pack("!I", 200 << 20) + b"x" * (64 << 10)):   # says 200 MiB follow
        time.sleep(REFUSAL_S)
        with waiting_head.connect() as sock:
            try:
                sock.sendall(request)
            except ConnectionResetError:
                pass   # the head closed it already
            assert until_closed(sock) < 2
    refusals = waiting_head.new_refusals(before, 2)
    assert [r.split(": ", 1)[1] for r in refusals] == [
        f"a message of {int.from_bytes(b'GET ', 'big')} bytes, over the 256 allowed",
        f"a message of {200 << 20} bytes, over the 256 allowed"]
    assert head.memory_info().rss - rss_before < 16 << 20
    waiting_head.assert_still_waiting()


def test_a_peer_sending_one_byte_every_2_s_is_dropped_at_the_handshake_deadline(waiting_head):
    time.sleep(REFUSAL_S)
    before = len(waiting_head.refusals())
    with waiting_head.connect() as sock:
        closed_after = until_closed(sock, drip=struct.pack("!I", 32) + b"x" * 32, every_s=2.0)
    assert HANDSHAKE_TIMEOUT_S - 0.5 < closed_after < HANDSHAKE_TIMEOUT_S + 2
    assert waiting_head.new_refusals(before, 1)[0].endswith(
        f": no handshake within {HANDSHAKE_TIMEOUT_S:g} s")
    waiting_head.assert_still_waiting()


def test_a_node_with_the_wrong_token_is_refused_in_one_line(waiting_head):
    time.sleep(REFUSAL_S)
    before = len(waiting_head.refusals())
    node1 = subprocess.run(ENGINE + ["generate", *TP2PP2, "--nnodes", "2", "--node-rank", "1",
                                     "--master-port", str(waiting_head.port)],
                           capture_output=True, text=True, timeout=60,
                           env=_env("not-the-test-token"))
    assert node1.returncode != 0 and node1.stderr.strip().splitlines() == [
        f"error: the head at 127.0.0.1:{waiting_head.port + 1} and node 1 have different "
        f"{TOKEN_VAR}s; set the same token on every node"]
    assert waiting_head.new_refusals(before, 1)[0].endswith(f": wrong {TOKEN_VAR}")
    waiting_head.assert_still_waiting()


# -- a flood of idle connections -------------------------------------------------------------

FLOOD = 300


def _flood(port: int) -> list[socket.socket]:
    """FLOOD connections to the node link, kept open and silent (a head that takes
    them one handshake at a time lets its listen queue fill, and fails here)."""
    socks, deadline = [], time.monotonic() + 15
    for _ in range(FLOOD):
        if time.monotonic() > deadline:
            break
        try:
            socks.append(socket.create_connection(("127.0.0.1", port + 1), timeout=2))
        except OSError:
            pass   # the listen queue was full for a moment: as good as refused
    assert len(socks) > FLOOD * 0.8
    return socks


def _waiting_head(port: int, log: IO[bytes], node_timeout: int) -> WaitingHead:
    proc = subprocess.Popen(ENGINE + _generate_args(4) + TP2PP2 + [
        "--nnodes", "2", "--master-port", str(port), "--node-timeout", str(node_timeout)],
        stdout=subprocess.PIPE, stderr=log, text=True, env=_env())
    head = WaitingHead(proc, port, log)
    deadline = time.monotonic() + 60
    while not head.listening():
        assert proc.poll() is None and time.monotonic() < deadline, head.stderr()
        time.sleep(0.1)
    return head


def _linked_at(node: subprocess.Popen, port: int, timeout: float = 60) -> float:
    """When the node's connection to the head's node link appeared."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(c.raddr and c.raddr.port == port
               for c in psutil.Process(node.pid).net_connections("tcp")):
            return time.monotonic()
        assert node.poll() is None, "the node ended before it connected"
        time.sleep(0.02)
    raise AssertionError("the node never connected to the head")


def _line_at(log: IO[bytes], text: str, timeout: float = 60) -> float:
    deadline = time.monotonic() + timeout
    while text not in text_so_far(log):
        assert time.monotonic() < deadline, text_so_far(log)
        time.sleep(0.02)
    return time.monotonic()


def test_under_300_connections_kept_open_a_node_joins_within_5_s_and_refusals_are_one_line_a_second():
    """Handshakes run at once: idle connections, each allowed HANDSHAKE_TIMEOUT_S, no
    longer queue a node behind them (one at a time, 300 of them delayed it 73 s, past
    --node-timeout); the run then ends as it would have without them."""
    port = free_port(consecutive=2)
    with tempfile.TemporaryFile() as log, tempfile.TemporaryFile() as node_log:
        head = _waiting_head(port, log, node_timeout=60)
        started, socks, node1 = time.monotonic(), _flood(port), None
        try:
            node1 = subprocess.Popen(ENGINE + ["generate", *TP2PP2, "--nnodes", "2",
                                               "--master-port", str(port), "--node-rank", "1"],
                                     stdout=subprocess.DEVNULL, stderr=node_log, env=_env())
            linked = _linked_at(node1, port + 1)
            joined_after = _line_at(node_log, "node 1 (ranks 2-3) joined the head") - linked
            out, _ = head.proc.communicate(timeout=120)
            node1.wait(timeout=30)
            refusals, elapsed = head.refusals(), time.monotonic() - started
        finally:
            for sock in socks:
                sock.close()
            head.proc.kill()
            if node1 is not None:
                node1.kill()
        assert joined_after < 5.0
        assert (head.proc.returncode, node1.returncode) == (0, 0), head.stderr()
        assert [len(json.loads(line)["token_ids"]) for line in out.splitlines()] == [4, 4]
        assert refusals and len(refusals) <= elapsed + 1


def test_under_300_connections_kept_open_the_head_still_gives_up_at_node_timeout():
    port = free_port(consecutive=2)
    with tempfile.TemporaryFile() as log:
        head = _waiting_head(port, log, node_timeout=3)
        socks = _flood(port)
        try:
            head.proc.wait(timeout=20)
        finally:
            for sock in socks:
                sock.close()
            head.proc.kill()
        assert head.proc.returncode != 0
        assert _error_lines(head.stderr()) == [
            f"error: node 1 did not join within 3 s (--node-timeout); start each with --nnodes 2 "
            f"--node-rank N --master-addr 127.0.0.1 --master-port {port}"]
