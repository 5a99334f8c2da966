"""Multi-node runs: the link between the head (node 0) and each headless node.

The head runs the scheduler and its own ranks; node n > 0 runs ranks
[n*k, (n+1)*k) and a relay. The ranks meet through torch.distributed's own
rendezvous at tcp://MASTER_ADDR:MASTER_PORT; the relays connect to the head at
MASTER_ADDR:MASTER_PORT+1.

Every node must hold the same secret in ENGINE_NODE_TOKEN. Before a single
object crosses a link, each end proves that it knows the token
(diagnose/core/link.py: HMAC-SHA256 over both ends' nonces, and a tag on every
message after). Until then the head reads messages of at most 256 bytes,
unpickles nothing, and gives the whole handshake HANDSHAKE_TIMEOUT_S.
Handshakes run at once, each on a thread of its own (diagnose/core/listener.py,
as diag's head does): at most MAX_PENDING at a time, and a host over its cap
loses its oldest, so idle connections cannot delay a node past --node-timeout.
Anything else that connects (a port scan, an HTTP request, a slow peer, a
wrong token) is dropped, refusals reach the head's stderr as at most one line
a second (the next counting those left out), and the head waits on for its
nodes. Past the handshake a peer is trusted: messages are pickles of at most
MAX_MESSAGE_BYTES, each sent or read within MESSAGE_TIMEOUT_S.

    node -> head   ("join", node_rank, fingerprint)
    head -> node   ("ok", config, device, dtype)  or  ("error", message)
    head -> node   ("rpc", (method, args, output_rank))   every collective_rpc
    node -> head   ("reply", rank, result)                 every reply a worker sends
    node -> head   ("died", message, rank, exitcode)       a worker of the node ended
    head -> node   ("shutdown", grace_s)                   stop the workers, exit 0
"""
from __future__ import annotations

import os
import pickle
import queue
import socket
import sys
import time
from contextlib import closing
from functools import partial
from multiprocessing.connection import wait

import torch

from diagnose.core.link import Codec, HandshakeError, Limits, Link
from diagnose.core.listener import Listener
from engine.config import EngineConfig
from engine.errors import EngineError
from engine.executor.local_workers import DEAD_GRACE_S, POLL_S, LocalWorkers, WorkerDiedError

TOKEN_VAR = "ENGINE_NODE_TOKEN"
MIN_TOKEN_CHARS = 8
HANDSHAKE_TIMEOUT_S = 5.0
MAX_PENDING = 64                   # connections in their handshake at once, from every host
MESSAGE_TIMEOUT_S = 30.0           # from the moment a message is sent or read
MAX_MESSAGE_BYTES = 256 << 20
RETRY_CONNECT_S = 0.2


class NodeError(EngineError):
    """The nodes of a multi-node run could not form one job."""


def node_token() -> bytes:
    token = os.environ.get(TOKEN_VAR, "")
    if len(token) < MIN_TOKEN_CHARS:
        raise NodeError(f"a multi-node run needs the shared token in {TOKEN_VAR} "
                        f"({MIN_TOKEN_CHARS} characters or more), the same on every node")
    return token.encode()


# -- the link ------------------------------------------------------------------

LIMITS = Limits(handshake_s=HANDSHAKE_TIMEOUT_S, message_s=MESSAGE_TIMEOUT_S,
                max_bytes=MAX_MESSAGE_BYTES)
PICKLES = Codec(lambda message: pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL),
                pickle.loads)


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

    def __init__(self, name: str, link: Link):
        self.name = name
        self.link = link

    def send(self, message: tuple) -> None:
        try:
            self.link.send(("rpc", message))
        except OSError:
            pass  # a lost node is reported when its link is read

    def receive(self) -> tuple[int, object]:
        """The next (rank, reply); raises WorkerDiedError if a worker of the node died
        or the node is gone."""
        try:
            kind, *body = self.link.recv()
        except (EOFError, OSError) as error:
            raise WorkerDiedError(f"{self.name} lost: {error}") from None
        if kind == "died":
            message, rank, exitcode = body
            raise WorkerDiedError(message, rank, exitcode)
        rank, reply = body
        return rank, reply

    def close(self, grace_s: float) -> None:
        try:
            self.link.send(("shutdown", grace_s))
        except OSError:
            pass  # already gone
        self.link.close()


def accept_nodes(config: EngineConfig, device: str, dtype: torch.dtype) -> list[RemoteNode]:
    """Wait for every headless node to join; RemoteNodes in node order. The nodes'
    workers run with the head's config, device and dtype. Handshakes run at once,
    each on a thread of diagnose/core/listener.py's, so that no flood of idle
    connections delays a node past --node-timeout."""
    key = node_token()
    host, port = link_address(config)
    try:
        server = socket.create_server((host, port))
    except OSError as error:
        raise NodeError(f"cannot listen for nodes on {host}:{port}: {error.strerror}") from None
    deadline = time.monotonic() + config.node_timeout
    arrivals: queue.Queue[tuple[Link, object, object]] = queue.Queue()
    listener = Listener(server, key, PICKLES, LIMITS, partial(_hello, arrivals),
                        "the head refused a node link", TOKEN_VAR, total=MAX_PENDING)
    welcome = ("ok", config, device, dtype)
    joined: dict[int, RemoteNode] = {}
    try:
        while len(joined) < config.nnodes - 1:
            link, node_rank, theirs = _next_arrival(arrivals, deadline, config, joined)
            _admit(link, node_rank, theirs, config, joined, welcome)
            joined[node_rank] = RemoteNode(describe_node(config, node_rank), link)
    except BaseException:
        for node in joined.values():
            node.link.close()
        raise
    finally:
        listener.close()
        _close_unclaimed(arrivals)
    return [joined[n] for n in sorted(joined)]


def _hello(arrivals: queue.Queue, link: Link, peer: tuple) -> None:
    """On a listener's thread: a peer that proved the token says who it is."""
    _, node_rank, theirs = link.recv()
    arrivals.put((link, node_rank, theirs))


def _next_arrival(arrivals: queue.Queue, deadline: float, config: EngineConfig,
                  joined: dict) -> tuple[Link, object, object]:
    try:
        return arrivals.get(timeout=max(deadline - time.monotonic(), 0.001))
    except queue.Empty:
        missing = [str(n) for n in range(1, config.nnodes) if n not in joined]
        raise NodeError(
            f"node{'s' if len(missing) > 1 else ''} {', '.join(missing)} did not join within "
            f"{config.node_timeout:g} s (--node-timeout); start each with --nnodes {config.nnodes} "
            f"--node-rank N --master-addr {config.master_addr} --master-port {config.master_port}"
        ) from None


def _admit(link: Link, node_rank: object, theirs: object, config: EngineConfig, joined: dict,
           welcome: tuple) -> None:
    """Check an authenticated node's settings and welcome it. A node that does not
    fit the head's settings fails both."""
    error = None
    if theirs != fingerprint(config):
        error = f"node {node_rank} was started with {theirs}, the head with {fingerprint(config)}"
    elif node_rank in joined:
        error = f"node {node_rank} joined twice"
    if error:
        link.send(("error", error))
        link.close()
        raise NodeError(error)
    link.settle()
    link.send(welcome)


def _close_unclaimed(arrivals: queue.Queue) -> None:
    """Links that proved the token after the head stopped waiting."""
    while True:
        try:
            arrivals.get_nowait()[0].close()
        except queue.Empty:
            return


# -- a headless node -----------------------------------------------------------

def run_node(config: EngineConfig) -> int:
    """Join the head, run this node's ranks and relay between them and the head
    until the head shuts down (exit 0) or something ends (an exception)."""
    config.validate()
    link, (head_config, device, dtype) = _join(config, node_token())
    name = describe_node(config, config.node_rank)
    print(f"{name} joined the head at {config.master_addr}:{config.master_port + 1}",
          file=sys.stderr, flush=True)
    grace_s = DEAD_GRACE_S
    with closing(link):
        workers = LocalWorkers(head_config, device, dtype, head_config.node_ranks(config.node_rank),
                               init_method(config))
        try:
            grace_s = _relay(link, workers)
        except WorkerDiedError as error:
            _tell_head(link, ("died", str(error), error.rank, error.exitcode))
            raise
        except (EOFError, OSError) as error:
            raise NodeError(f"{name} lost the head: {error}") from None
        finally:
            link.close()  # first: the head hears of the end before its ranks fail on it
            workers.shutdown(grace_s)
    return 0


def _join(config: EngineConfig, key: bytes) -> tuple[Link, tuple]:
    """Connect to the head (retrying until --node-timeout), prove the token both ways
    and pass the head's checks; returns the link and the head's (config, device,
    dtype), which the workers run with."""
    host, port = link_address(config)
    deadline = time.monotonic() + config.node_timeout
    sock = _connect(host, port, deadline, config)
    link = Link(sock, PICKLES, LIMITS,
                handshake_s=max(deadline - time.monotonic(), HANDSHAKE_TIMEOUT_S))
    try:
        link.authenticate(key, challenge_first=False)
        link.send(("join", config.node_rank, fingerprint(config)))
        kind, *body = link.recv()
    except HandshakeError as error:
        if error.wrong_key:
            raise NodeError(f"the head at {host}:{port} and node {config.node_rank} have "
                            f"different {TOKEN_VAR}s; set the same token on every node") from None
        raise NodeError(f"the head at {host}:{port} did not accept node {config.node_rank}: "
                        f"{error}") from None
    except (EOFError, OSError) as error:
        link.close()
        raise NodeError(f"the head at {host}:{port} did not accept node {config.node_rank}: "
                        f"{error}") from None
    if kind == "error":
        link.close()
        raise NodeError(body[0])
    link.settle()
    return link, body


def _connect(host: str, port: int, deadline: float, config: EngineConfig) -> socket.socket:
    while True:
        try:
            return socket.create_connection((host, port), timeout=RETRY_CONNECT_S)
        except OSError:
            if time.monotonic() >= deadline:
                raise NodeError(f"no head answered at {host}:{port} within "
                                f"{config.node_timeout:g} s (--node-timeout)") from None
            time.sleep(RETRY_CONNECT_S)


def _relay(link: Link, workers: LocalWorkers) -> float:
    """Forward the head's messages into the ring and every worker reply back, one
    at a time, until the head says shut down; returns the grace it gave."""
    while True:
        ready = wait([link] + workers.waitables(), timeout=POLL_S)
        for rank, reply in workers.take_replies():
            link.send(("reply", rank, reply))
        workers.check()
        if link in ready:
            kind, body = link.recv()
            if kind == "shutdown":
                return body
            workers.submit(body, should_abort=workers.check)


def _tell_head(link: Link, message: tuple) -> None:
    try:
        link.send(message)
    except OSError:
        pass  # the head is gone too
