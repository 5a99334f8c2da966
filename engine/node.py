"""Multi-node runs: the link between the head (node 0) and each headless node.

The head runs the scheduler and its own ranks; node n > 0 runs ranks
[n*k, (n+1)*k) and a relay. The ranks meet through torch.distributed's own
rendezvous at tcp://MASTER_ADDR:MASTER_PORT; the relays connect to the head at
MASTER_ADDR:MASTER_PORT+1.

Messages are length-prefixed pickles. A peer is trusted as much as
torch.distributed's own store trusts it: anyone who can reach the port can
run code in the engine, so keep the address on a private network.

    node -> head   ("join", node_rank, fingerprint)
    head -> node   ("ok", config, device, dtype)  or  ("error", message)
    head -> node   ("rpc", (method, args, output_rank))   every collective_rpc
    node -> head   ("reply", rank, result)                 every reply a worker sends
    node -> head   ("died", message, rank, exitcode)       a worker of the node ended
    head -> node   ("shutdown", grace_s)                   stop the workers, exit 0
"""
from __future__ import annotations

import pickle
import socket
import struct
import sys
import time
from multiprocessing.connection import wait

import torch

from engine.config import EngineConfig
from engine.local_workers import DEAD_GRACE_S, POLL_S, LocalWorkers, WorkerDiedError

_LENGTH = struct.Struct("!Q")
RETRY_CONNECT_S = 0.2


class NodeError(RuntimeError):
    """The nodes of a multi-node run could not form one job."""


# -- framing -----------------------------------------------------------------

def send_message(sock: socket.socket, message: tuple) -> None:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_LENGTH.pack(len(payload)) + payload)


def recv_message(sock: socket.socket) -> tuple:
    """The next message; EOFError when the peer closed the connection."""
    (length,) = _LENGTH.unpack(_recv_exactly(sock, _LENGTH.size))
    return pickle.loads(_recv_exactly(sock, length))


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError("the connection closed")
        data += chunk
    return bytes(data)


def fingerprint(config: EngineConfig) -> str:
    """The settings every node must agree on."""
    return (f"tp={config.tensor_parallel_size} pp={config.pipeline_parallel_size} "
            f"nnodes={config.nnodes} model={config.model}")


def init_method(config: EngineConfig) -> str:
    """torch.distributed's rendezvous, the same on every node."""
    return f"tcp://{config.master_addr}:{config.master_port}"


def link_address(config: EngineConfig) -> tuple[str, int]:
    return config.master_addr, config.master_port + 1


def describe_node(config: EngineConfig, node_rank: int) -> str:
    ranks = config.node_ranks(node_rank)
    if len(ranks) == 1:
        return f"node {node_rank} (rank {ranks[0]})"
    return f"node {node_rank} (ranks {ranks[0]}-{ranks[-1]})"


# -- the head's side -----------------------------------------------------------

class RemoteNode:
    """The head's end of one headless node's link."""

    def __init__(self, name: str, sock: socket.socket):
        self.name = name
        self.sock = sock

    def send(self, message: tuple) -> None:
        try:
            send_message(self.sock, ("rpc", message))
        except OSError:
            pass  # a lost node is reported when its socket is read

    def receive(self) -> tuple[int, object]:
        """The next (rank, reply); raises WorkerDiedError if a worker of the node died
        or the node is gone."""
        try:
            kind, *body = recv_message(self.sock)
        except (EOFError, OSError) as error:
            raise WorkerDiedError(f"{self.name} lost: {error}") from None
        if kind == "died":
            message, rank, exitcode = body
            raise WorkerDiedError(message, rank, exitcode)
        rank, reply = body
        return rank, reply

    def close(self, grace_s: float) -> None:
        try:
            send_message(self.sock, ("shutdown", grace_s))
        except OSError:
            pass  # already gone
        self.sock.close()


def accept_nodes(config: EngineConfig, device: str, dtype: torch.dtype) -> list[RemoteNode]:
    """Wait for every headless node to join; RemoteNodes in node order. The nodes'
    workers run with the head's config, device and dtype."""
    host, port = link_address(config)
    try:
        server = socket.create_server((host, port))
    except OSError as error:
        raise NodeError(f"cannot listen for nodes on {host}:{port}: {error.strerror}") from None
    deadline = time.monotonic() + config.node_timeout
    joined: dict[int, RemoteNode] = {}
    try:
        with server:
            while len(joined) < config.nnodes - 1:
                sock = _accept(server, deadline, config, joined)
                node_rank = _admit(sock, deadline, config, joined, ("ok", config, device, dtype))
                if node_rank is not None:
                    joined[node_rank] = RemoteNode(describe_node(config, node_rank), sock)
    except BaseException:
        for node in joined.values():
            node.sock.close()
        raise
    return [joined[n] for n in sorted(joined)]


def _accept(server: socket.socket, deadline: float, config: EngineConfig,
            joined: dict) -> socket.socket:
    server.settimeout(max(deadline - time.monotonic(), 0.001))
    try:
        sock, _ = server.accept()
    except TimeoutError:
        missing = [str(n) for n in range(1, config.nnodes) if n not in joined]
        raise NodeError(
            f"node{'s' if len(missing) > 1 else ''} {', '.join(missing)} did not join within "
            f"{config.node_timeout:g} s (--node-timeout); start each with --nnodes {config.nnodes} "
            f"--node-rank N --master-addr {config.master_addr} --master-port {config.master_port}"
        ) from None
    return sock


def _admit(sock: socket.socket, deadline: float, config: EngineConfig, joined: dict,
           welcome: tuple) -> int | None:
    """Check a joining node; its node rank, or None for a connection that is no node."""
    sock.settimeout(max(deadline - time.monotonic(), 0.001))
    try:
        _, node_rank, theirs = recv_message(sock)
    except (EOFError, OSError):  # it went away, or never spoke
        sock.close()
        return None
    error = None
    if theirs != fingerprint(config):
        error = f"node {node_rank} was started with {theirs}, the head with {fingerprint(config)}"
    elif node_rank in joined:
        error = f"node {node_rank} joined twice"
    if error:
        send_message(sock, ("error", error))
        sock.close()
        raise NodeError(error)
    send_message(sock, welcome)
    sock.settimeout(None)
    return node_rank


# -- a headless node -----------------------------------------------------------

def run_node(config: EngineConfig) -> int:
    """Join the head, run this node's ranks and relay between them and the head
    until the head shuts down (exit 0) or something ends (an exception)."""
    config.validate()
    sock, (head_config, device, dtype) = _join(config)
    name = describe_node(config, config.node_rank)
    print(f"{name} joined the head at {config.master_addr}:{config.master_port + 1}",
          file=sys.stderr, flush=True)
    grace_s = DEAD_GRACE_S
    with sock:
        workers = LocalWorkers(head_config, device, dtype, head_config.node_ranks(config.node_rank),
                               init_method(config))
        try:
            grace_s = _relay(sock, workers)
        except WorkerDiedError as error:
            _tell_head(sock, ("died", str(error), error.rank, error.exitcode))
            raise
        except (EOFError, OSError) as error:
            raise NodeError(f"{name} lost the head: {error}") from None
        finally:
            sock.close()  # first: the head hears of the end before its ranks fail on it
            workers.shutdown(grace_s)
    return 0


def _join(config: EngineConfig) -> tuple[socket.socket, tuple]:
    """Connect to the head (retrying until --node-timeout) and pass its checks;
    returns the link and the head's (config, device, dtype), which the workers run with."""
    host, port = link_address(config)
    deadline = time.monotonic() + config.node_timeout
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=RETRY_CONNECT_S)
            break
        except OSError:
            if time.monotonic() >= deadline:
                raise NodeError(f"no head answered at {host}:{port} within "
                                f"{config.node_timeout:g} s (--node-timeout)") from None
            time.sleep(RETRY_CONNECT_S)
    try:
        sock.settimeout(max(deadline - time.monotonic(), 1.0))
        send_message(sock, ("join", config.node_rank, fingerprint(config)))
        kind, *body = recv_message(sock)
    except (EOFError, OSError) as error:
        sock.close()
        raise NodeError(f"the head at {host}:{port} did not accept node {config.node_rank}: "
                        f"{error}") from None
    if kind == "error":
        sock.close()
        raise NodeError(body[0])
    sock.settimeout(None)
    return sock, body


def _relay(sock: socket.socket, workers: LocalWorkers) -> float:
    """Forward the head's messages into the ring and every worker reply back, one
    at a time, until the head says shut down; returns the grace it gave."""
    while True:
        ready = wait([sock] + workers.waitables(), timeout=POLL_S)
        for rank, reply in workers.take_replies():
            send_message(sock, ("reply", rank, reply))
        workers.check()
        if sock in ready:
            kind, body = recv_message(sock)
            if kind == "shutdown":
                return body
            workers.submit(body, should_abort=workers.check)


def _tell_head(sock: socket.socket, message: tuple) -> None:
    try:
        send_message(sock, message)
    except OSError:
        pass  # the head is gone too
