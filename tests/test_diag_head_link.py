"""The head `diag launch` of a multi-node job against connections that are no
agent of the run: each attack fails to get in, costs the head little memory
and few threads, is closed with one line on its stderr, and a real agent
still joins afterwards."""
import os
import pickle
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

from diagnose.launch.nodes import HANDSHAKE_S, MAX_PENDING, NodeAgent, NodeError
from helpers.live_log import text_so_far
from helpers.peers import until_closed
from helpers.run import REPO, free_port, left_behind

TOKEN = "diag-test-token-7a1"
REFUSED = "diag: the head refused a node link from 127.0.0.1:"
MORE = re.compile(r" \(and \d+ more refused in the last \d+ s\)$")   # the refusals left out


class Head:
    """`diag launch` as node 0 of 2 around a command that sleeps; stderr in a file."""

    def __init__(self, tmp_path):
        self.port, self.run_dir = free_port(), tmp_path / "head"
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "diagnose.cli", "launch", "--run-dir", str(self.run_dir),
             "--nnodes", "2", "--listen", f"127.0.0.1:{self.port}", "--on-hang", "wait", "--",
             sys.executable, "-c", "import time; time.sleep(600)"],
            cwd=REPO, env=dict(os.environ, DIAG_NODE_TOKEN=TOKEN), stdout=subprocess.DEVNULL,
            stderr=self.log)
        self.process = psutil.Process(self.proc.pid)
        deadline = time.monotonic() + 30
        while not self.listening():
            assert self.proc.poll() is None and time.monotonic() < deadline, self.stderr()
            time.sleep(0.1)

    def listening(self) -> bool:
        return any(c.status == psutil.CONN_LISTEN and c.laddr.port == self.port
                   for c in self.process.net_connections("tcp"))

    def connections(self) -> int:
        return sum(c.status == psutil.CONN_ESTABLISHED and c.laddr.port == self.port
                   for c in self.process.net_connections("tcp"))

    def stderr(self) -> str:
        return text_so_far(self.log)

    def refusals(self) -> list[str]:
        return [line for line in self.stderr().splitlines() if line.startswith(REFUSED)]

    def new_refusals(self, before: int, count: int) -> list[str]:
        deadline = time.monotonic() + 10
        while len(self.refusals()) < before + count and time.monotonic() < deadline:
            time.sleep(0.05)
        return [MORE.sub("", line.split(": ", 2)[2]) for line in self.refusals()[before:]]

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    head = Head(tmp_path_factory.mktemp("attacks"))
    yield head
    assert head.proc.poll() is None, head.stderr()   # no attack ended it
    head.stop()
    assert not left_behind(head.run_dir)


def test_announcing_200_mb_three_times_costs_the_head_no_memory(head):
    rss_before = head.process.memory_info().rss
    before = len(head.refusals())
    for _ in range(3):
        time.sleep(1.1)                   # refusals are one line a second at most
        with head.connect() as sock:
            try:
                sock.sendall((200 << 20).to_bytes(4, "big") + b"x" * (64 << 10))
            except ConnectionResetError:
                pass
            assert until_closed(sock) < 2
    assert head.new_refusals(before, 3) == [f"a message of {200 << 20} bytes, over the 256 "
                                            f"allowed"] * 3
    assert head.process.memory_info().rss - rss_before < 16 << 20


def test_300_idle_connections_cost_the_head_a_few_threads_for_a_few_seconds(head):
    threads_before = head.process.num_threads()
    socks, most_threads = [], 0
    for _ in range(300):
        try:
            socks.append(socket.create_connection(("127.0.0.1", head.port), timeout=2))
        except OSError:
            pass   # the listen queue was full for a moment: as good as refused
        most_threads = max(most_threads, head.process.num_threads())
    assert len(socks) > 250
    deadline = time.monotonic() + HANDSHAKE_S + 5
    while head.connections() and time.monotonic() < deadline:
        most_threads = max(most_threads, head.process.num_threads())
        time.sleep(0.1)
    assert head.connections() == 0
    assert most_threads <= threads_before + MAX_PENDING
    for sock in socks:
        sock.close()


def test_a_peer_sending_one_byte_every_3_s_is_dropped_at_the_handshake_deadline(head):
    time.sleep(1.1)
    before = len(head.refusals())
    with head.connect() as sock:
        closed_after = until_closed(sock, drip=(32).to_bytes(4, "big") + b"x" * 32)
    assert HANDSHAKE_S - 0.5 < closed_after < HANDSHAKE_S + 2
    assert head.new_refusals(before, 1) == [f"no handshake within {HANDSHAKE_S:g} s"]


def test_the_token_in_clear_or_a_pickle_gets_nowhere(head, tmp_path):
    marker = tmp_path / "unpickled"
    old_hello = b'{"token": "%s", "node_rank": 1, "host": "x"}' % TOKEN.encode()
    payload = pickle.dumps(_Touch(str(marker)))
    before = len(head.refusals())
    for message in (old_hello, payload):
        time.sleep(1.1)                   # refusals are one line a second at most
        with head.connect() as sock:
            sock.sendall(len(message).to_bytes(4, "big") + message)
            assert until_closed(sock) < 2
    assert head.new_refusals(before, 2) == ["wrong DIAG_NODE_TOKEN"] * 2
    assert not marker.exists()


def test_an_agent_with_the_wrong_token_is_refused_in_one_line(head):
    time.sleep(1.1)
    before = len(head.refusals())
    with pytest.raises(NodeError, match="node 1: the head refused the token"):
        NodeAgent(f"127.0.0.1:{head.port}", b"not-the-token", 1).publish({}, None, 0)
    assert head.new_refusals(before, 1) == ["wrong DIAG_NODE_TOKEN"]


def test_under_300_connections_kept_open_an_agent_joins_within_5_s_and_refusals_are_one_line_a_second(
        head):
    lines_before, started = len(head.stderr().splitlines()), time.monotonic()
    socks = []
    for _ in range(300):
        try:
            socks.append(socket.create_connection(("127.0.0.1", head.port), timeout=2))
        except OSError:
            pass
    try:
        joining = time.monotonic()
        agent = NodeAgent(f"127.0.0.1:{head.port}", TOKEN.encode(), 1)
        reply = agent.publish({}, None, 0)
        joined_after = time.monotonic() - joining
        assert reply is not None, agent.note
        assert joined_after < 5.0
        agent.close()
        time.sleep(HANDSHAKE_S + 1)          # the idle ones reach their deadline meanwhile
    finally:
        for sock in socks:
            sock.close()
    lines = head.stderr().splitlines()[lines_before:]
    refusals = [line for line in lines if line.startswith(REFUSED)]
    assert refusals and len(refusals) <= time.monotonic() - started + 1


def test_a_real_agent_still_joins_after_the_attacks(head):
    agent = NodeAgent(f"127.0.0.1:{head.port}", TOKEN.encode(), 1)
    reply = agent.publish({}, None, 0)
    assert reply is not None and reply.stop is None, agent.note
    assert agent.publish({}, 0, 0, finished=True) is not None
    agent.close()


class _Touch:
    """Unpickling it would run `touch path`."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(self.path)}",)
