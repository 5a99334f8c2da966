"""Multi-node jobs: one `diag launch` per node, all reporting to the head's.

The head (`--listen HOST:PORT`) listens on that address only. Every other
node's launcher is an agent (`--head HOST:PORT --node-rank N`): it connects,
it and the head prove to each other that they know the shared token
(DIAG_NODE_TOKEN; the token never crosses the wire), and after each poll it
sends the ranks its own run dir shows: whole on a new link, else what changed
since the report the head last applied (diagnose/launch/node_delta.py). The head
keeps each node's ranks decoded and checked in memory, applies the changes, and
hands its collector the merged ranks; it writes them to its run dir
(node-N.json) when a node comes or goes, at a node's first report after its
verdicts changed, and every SAVE_S, for `diag analyze` and `diag tui` on the
run dir. The head answers each
report with its verdicts, whether it applied it (or wants a whole one) and,
when it wants them, a stacks dump or a stop.

A node whose agent dropped the connection without saying goodbye, or went
silent, is lost: the analysis names the node (`node_lost`) instead of judging
its ranks by a state that is no longer news. A head that falls behind its
reports is not silence: an agent waits up to REPLY_S for the answer to one (a
new link would cost a whole report, and more behind), and a node whose report
waits on the head is heard.

Messages are JSON over diagnose/core/link.py's authenticated link. The head
listens through diagnose/core/listener.py, as the engine's head does: at most
MAX_PENDING connections in their handshake (a few bytes each, HANDSHAKE_S at
most), each on a thread of its own, and one per node after it; a host with
more than the Gate's per-source cap in handshakes loses its oldest, so idle
connections cannot lock a real agent out. Anything else that connects is
closed, and refusals reach the head's stderr as at most one line a second.
"""
from __future__ import annotations

import io
import json
import multiprocessing
import os
import select
import socket
import threading
import time
from dataclasses import asdict, dataclass, field, fields, replace

from diagnose.core.link import Codec, HandshakeError, Limits, Link, json_codec
from diagnose.core.listener import Listener
from diagnose.core.checked import checked
from diagnose.core.files import read_small
from diagnose.core.groups import GroupReader
from diagnose.core.heap import gc_paused
from diagnose.core.rows import as_row, built
from diagnose.core.schema import Document, read_version, stamped
from diagnose.core.snapshot import NodeState, RankState, Snapshot
from diagnose.core.workers import PlainUnpickler, cores, pool, sent, start
from diagnose.launch.node_delta import HEAD_RING_ITEMS, Known, ReportWriter, checked_rows

TOKEN_VAR = "DIAG_NODE_TOKEN"
LOST_AFTER_S = 3.0          # an agent silent this long is lost
JOIN_GRACE_S = 30.0         # an expected node that never reported is lost after this
HANDSHAKE_S = 5.0
MESSAGE_S = 10.0            # an agent reports every poll: silent this long, it is dropped
MAX_PENDING = 64            # connections in their handshake at once, from every host
SAVE_S = 10.0               # a node's file is written at least this often while it reports
REPLY_S = 60.0              # an agent waits this long for the head's answer to a report
PARALLEL_BYTES = 32 << 20   # node files together past this are read by worker processes
WORKER_BYTES = 1 << 20      # a report past this is decoded and checked by a worker process
WORKER_WAIT_S = 60.0        # how long the head waits for a worker's check of one report
LIMITS = Limits(handshake_s=HANDSHAKE_S, message_s=MESSAGE_S, max_bytes=256 << 20)
AGENT_LIMITS = Limits(handshake_s=HANDSHAKE_S, message_s=REPLY_S, max_bytes=LIMITS.max_bytes)


class NodeError(Exception):
    """A bad address or token, or a head that refused this agent."""


def parse_address(text: str, flag: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise NodeError(f"{flag} must be HOST:PORT, not {text!r}")
    return host, int(port)


def token_from_env() -> bytes:
    token = os.environ.get(TOKEN_VAR, "")
    if len(token) < 8:
        raise NodeError(f"a multi-node launch needs the shared token in {TOKEN_VAR} "
                        f"(8 characters or more), the same on every node")
    return token.encode()


def node_file(run_dir: str, node_rank: int) -> str:
    return os.path.join(run_dir, f"node-{node_rank}.json")


_JSON = json_codec(default=str)


def _decode(data: bytes) -> dict:
    body = _JSON.decode(data)
    if not isinstance(body, dict):
        raise ValueError("a message that is not a JSON object")
    return body


JSON = Codec(_JSON.encode, _decode)


# -- the head ------------------------------------------------------------------

@dataclass
class NodeReport:
    """What the head last heard from one node; node-N.json holds it."""
    node_rank: int
    host: str = ""
    expected_since: float = field(default_factory=time.time)
    received_at: float | None = None
    connected: bool = False
    finished: bool = False         # said goodbye after its command ended
    dropped: bool = False          # the connection ended without a goodbye
    command_exit: int | None = None
    dump_done: int = 0
    ranks: dict = field(default_factory=dict)  # rank -> RankState as asdict, groups as ranges
    saved_at: float | None = None  # when the head wrote the file: what it knew then
    heard_at: float | None = None  # a report of it was waiting on the head then


@dataclass
class NodeView:
    """A node as its head knows it, for the merge: the report's news, and its
    ranks decoded (what a snapshot holds of them; nobody modifies them)."""
    report: NodeReport
    states: dict[int, RankState]


class NodeHub:
    """The head's listener: one thread per connection, each node's ranks kept in
    memory (`nodes`), and in the run dir now and then. A report of more than
    WORKER_BYTES (a node's whole state, the rings of a thousand ranks that
    stopped) is decoded and checked by one of `readers` worker processes (by
    default one a node, less one core for the head), so that the reports of
    every node of a large job that hung at once are checked side by side; the
    head's interpreter only builds their items."""

    def __init__(self, listen: str, key: bytes, run_dir: str, nnodes: int,
                 readers: int | None = None):
        self.address = parse_address(listen, "--listen")
        self.key, self.run_dir = key, run_dir
        self.reports = {n: NodeReport(n) for n in range(1, nnodes)}
        self.known: dict[int, Known] = {}   # node rank -> the report it last applied
        self.large_taking = 0               # reports past WORKER_BYTES read or applied now
        self.large_applied = 0              # and applied so far
        self.news = 0                       # large_applied when none was being taken last
        self.taking: set[int] = set()       # nodes whose report the head reads or applies now
        self.saved: dict[int, float] = dict.fromkeys(self.reports, 0.0)   # monotonic
        self.groups = GroupReader()
        self.links: dict[int, Link] = {}  # node rank -> its agent's authenticated link
        self.verdicts: list[dict] = []   # the head's latest, sent back to every agent
        self.dump_wanted = 0
        self.stop_code: int | None = None  # agents end their commands with this code
        self.closing = False             # the head ends the links itself: not a node's drop
        self.lock = threading.Lock()
        self.save_lock = threading.Lock()
        server = _listen(self.address)
        self.readers = start(min(nnodes - 1, cores() - 1) if readers is None else readers)
        self.save_all()
        self.listener = Listener(server, key, JSON, LIMITS, self._welcome,
                                 "diag: the head refused a node link", TOKEN_VAR,
                                 serve=self._serve, total=MAX_PENDING)

    def _serve(self, link: Link, peer: tuple, report: NodeReport) -> None:
        try:
            while self._take(link, report):
                pass
        except (OSError, EOFError, TypeError, ValueError):
            pass
        finally:
            link.close()
            self._left(report, link)

    def _welcome(self, link: Link, peer: tuple) -> NodeReport | None:
        """The node's report once its agent (which proved the token) named a node
        this head expects; None (the link closed) for any other."""
        hello = link.recv()
        node_rank = hello.get("node_rank")
        if type(node_rank) is not int or node_rank not in self.reports:
            link.send({"error": f"the head expects node ranks 1-{len(self.reports)}, "
                                f"not {node_rank!r}"})
            link.close()
            return None
        link.send({"ok": True})
        link.settle()
        with self.lock:
            replaced = self.links.get(node_rank)
            self.links[node_rank] = link
        if replaced is not None:         # the agent reconnected: its old link is dead
            replaced.shutdown()
        report = self.reports[node_rank]
        self._update(report, host=str(hello.get("host", "")), connected=True, dropped=False,
                     finished=False)
        self.saved[node_rank] = 0.0      # its first report is written at once
        return report

    def _take(self, link: Link, report: NodeReport) -> bool:
        """One report and the head's answer; False once the agent said goodbye."""
        data = link.recv_bytes(LIMITS.max_bytes)
        known = self.apply(report, data, link)
        with self.lock:
            answer = {"verdicts": self.verdicts, "dump": self.dump_wanted, "stop": self.stop_code,
                      "applied": known.seq if known else None}
        if known and (report.finished or time.monotonic() - self.saved[report.node_rank] >= SAVE_S):
            self._save(report)
        link.send(answer)
        return not (known and report.finished)

    def apply(self, report: NodeReport, data: bytes, link: Link | None = None) -> Known | None:
        """A node's report applied: what the head holds of the node now; None for
        one it refused (garbage, a delta on what it lacks) or that came on a link
        no longer the node's (`link`; None: no link, as benchmarks replay reports)."""
        node, large = report.node_rank, len(data) > WORKER_BYTES
        with self.lock:
            self.taking.add(node)
            self.large_taking += large
        try:
            body, rows_checked = self._decode(data)
            news = _news(body)
            known = Known.read(body, self.known.get(node), self.groups, rows_checked)
        except ValueError:
            known = None
        with self.lock:
            self.taking.discard(node)
            self.large_taking -= large
            if known is not None and (link is None or self.links.get(node) is link):
                self.known[node] = known
                self.large_applied += large
                for name, value in news.items():
                    setattr(report, name, value)
                report.received_at = time.time()
            else:
                known = None
            if not self.large_taking:       # the rings of a node's stopped ranks, all in
                self.news = self.large_applied
        return known

    @property
    def large_incoming(self) -> bool:
        """A report past WORKER_BYTES is being read or applied now."""
        return self.large_taking > 0

    def _decode(self, data: bytes) -> tuple[dict, bool]:
        """The report, and whether a worker checked its items (`checked_rows`)."""
        if self.readers is None or len(data) <= WORKER_BYTES:
            return JSON.decode(data), False
        try:
            answer = self.readers.apply_async(_report_in_worker, (data,)).get(WORKER_WAIT_S)
        except multiprocessing.TimeoutError:
            raise ValueError(f"a report not checked within {WORKER_WAIT_S:g} s") from None
        body, problem = PlainUnpickler(io.BytesIO(answer), "a report a worker checked").load()
        if body is None:
            raise ValueError(problem)
        return body, True

    def _left(self, report: NodeReport, link: Link) -> None:
        """The link ended; the node is gone unless a newer link of it took over."""
        with self.lock:
            if self.links.get(report.node_rank) is not link:
                return
            del self.links[report.node_rank]
            closing = self.closing
        self._update(report, connected=False, dropped=not (report.finished or closing))

    def _update(self, report: NodeReport, **changes) -> None:
        with self.lock:
            for name, value in changes.items():
                setattr(report, name, value)
        self._save(report)

    def _save(self, report: NodeReport) -> None:
        """node-N.json: what the head knows of the node now, its ranks as they crossed."""
        with self.save_lock:
            with self.lock:
                body = {field.name: getattr(report, field.name) for field in fields(report)}
                known = self.known.get(report.node_rank)
            body["saved_at"] = time.time()
            self.saved[report.node_rank] = time.monotonic()
            path = node_file(self.run_dir, report.node_rank)
            with open(path + ".tmp", "w") as f:   # a shallow body: asdict copied every rank
                f.write(node_text(body, known.wire if known else {}))
            os.replace(path + ".tmp", path)

    def save_all(self) -> None:
        for report in self.reports.values():
            self._save(report)

    def nodes(self) -> list[NodeView]:
        """Every node as the head knows it now, for its collector's merge. A node
        whose report waits on its socket, or is being applied, is heard now: a
        head that falls behind its reports does not take its nodes for lost."""
        now = time.time()
        with self.lock:
            waiting = {n for n, link in self.links.items() if n in self.taking or _readable(link)}
            return [NodeView(replace(report, heard_at=now if n in waiting else None),
                             self.known[n].states if n in self.known else {})
                    for n, report in self.reports.items()]

    # -- what the head's launcher asks of it --------------------------------

    def share_verdicts(self, verdicts: list) -> None:
        """The verdicts the agents are told. When they change, each node's file is
        written again at its next report (not here: at 16 nodes of 1,024 ranks that
        takes seconds, which the verdict would wait on), so that the run dir shows
        what they were drawn from."""
        shared = [asdict(verdict) for verdict in verdicts]
        with self.lock:
            if _gist(shared) != _gist(self.verdicts):
                self.saved = dict.fromkeys(self.saved, 0.0)
            self.verdicts = shared

    def request_dump(self, wait_s: float) -> list[str]:
        """Every connected agent dumps its ranks' stacks; notes for those that did not."""
        with self.lock:
            self.dump_wanted += 1
            wanted = self.dump_wanted
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and self._waiting_for_dump(wanted):
            time.sleep(0.05)
        return [f"node {n}: no stacks dump within {wait_s:g}s"
                for n in self._waiting_for_dump(wanted)]

    def _waiting_for_dump(self, wanted: int) -> list[int]:
        with self.lock:
            return [n for n, r in self.reports.items() if r.connected and r.dump_done < wanted]

    def stop_agents(self, exit_code: int, wait_s: float) -> bool:
        """Tell every agent to end its command and exit with exit_code."""
        with self.lock:
            self.stop_code = exit_code
        return self.wait_for_agents(wait_s)

    def wait_for_agents(self, wait_s: float) -> bool:
        """True once every agent said goodbye, dropped, or went silent."""
        deadline = time.monotonic() + wait_s
        while any(self._listening(report) for report in self.reports.values()):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    @staticmethod
    def _listening(report: NodeReport) -> bool:
        return report.connected and (report.received_at is None
                                     or time.time() - report.received_at < LOST_AFTER_S)

    def close(self) -> None:
        self.listener.close()
        with self.lock:
            self.closing = True
            links = list(self.links.values())
        for link in links:
            link.shutdown()
        if self.readers is not None:
            self.readers.terminate()
            self.readers.join()
        self.save_all()


def _readable(link: Link) -> bool:
    try:
        return bool(select.select([link.sock], [], [], 0)[0])
    except (OSError, ValueError):      # closed meanwhile
        return False


def _news(body: dict) -> dict:
    """A report's word on the node beyond its ranks; ValueError if malformed."""
    command_exit, dump_done = body.get("command_exit"), body.get("dump_done", 0)
    finished = body.get("finished", False)
    if not (command_exit is None or type(command_exit) is int) or type(dump_done) is not int \
            or type(finished) is not bool:
        raise ValueError("a report whose command_exit, dump_done or finished is malformed")
    return {"command_exit": command_exit, "dump_done": dump_done, "finished": finished}


def _gist(verdicts: list[dict]) -> list[tuple]:
    """What makes verdicts different ones (their sentences' "for 3 s" aside)."""
    return [(v["kind"], v["culprit_ranks"], v["phase"], v["step"], v["group"]) for v in verdicts]


def _listen(address: tuple[str, int]) -> socket.socket:
    try:
        server = socket.create_server(address, reuse_port=False)
    except OSError as error:
        raise NodeError(f"--listen {address[0]}:{address[1]}: {error.strerror}") from None
    return server


# -- merging, on the head's collector ----------------------------------------

class NodeFiles:
    """The node-N.json files of a head's run dir (`diag analyze`, `diag tui`), each
    decoded and checked again only when the head wrote it again. Files of more
    than PARALLEL_BYTES together are read by worker processes, a file each, one
    a core: this process only builds what they checked (core/rows.py)."""

    def __init__(self):
        self.groups = GroupReader()     # the identities' groups, each distinct text once
        self._read: dict[str, tuple[tuple, NodeView | None, str | None]] = {}

    def read(self, run_dir: str) -> tuple[list[NodeView], list[str], list[str]]:
        """The nodes; notes on the ranks of a node that could not be read (the node
        counts, without them); notes on the files that could not be read at all."""
        nodes, notes, refused, changed = [], [], [], []
        names = sorted(name for name in os.listdir(run_dir)
                       if name.startswith("node-") and name.endswith(".json"))
        stamps = {}
        for name in names:
            try:
                info = os.stat(os.path.join(run_dir, name))
            except OSError as error:
                refused.append(f"{name}: {error.strerror}")
                continue
            stamps[name] = (info.st_mtime_ns, info.st_size, info.st_ino)
            if self._read.get(name, (None,))[0] != stamps[name]:
                changed.append(name)
        with gc_paused(freeze=False):     # a thousand ranks' states a node, made at once
            for name, decoded in zip(changed, self._decode_all(run_dir, changed, stamps)):
                self._read[name] = (stamps[name], *decoded)
        for name in stamps:
            _, node, problem = self._read[name]
            if node is None:
                refused.append(problem)
                continue
            nodes.append(node)
            if problem:
                notes.append(problem)
        return nodes, notes, refused

    def _decode_all(self, run_dir: str, names: list[str],
                    stamps: dict) -> list[tuple[NodeView | None, str | None]]:
        paths = [os.path.join(run_dir, name) for name in names]
        large = len(names) > 1 and sum(stamps[name][1] for name in names) > PARALLEL_BYTES
        with pool(min(cores(), len(names)) if large else 1) as readers:
            if readers is None:
                return [self._decode(path) for path in paths]
            return [_node_from_worker(PlainUnpickler(io.BytesIO(data)).load())
                    for data in readers.imap(_decode_in_worker, paths)]

    def _decode(self, path: str) -> tuple[NodeView | None, str | None]:
        name = os.path.basename(path)
        try:
            body = json.loads(read_small(path, LIMITS.max_bytes))
            report = checked(NodeReport, read_version(Document.NODE, body))
        except (OSError, ValueError, RecursionError) as error:
            return None, f"{name}: {error}"
        wire, report.ranks = report.ranks, {}
        try:
            states = Known.read({"seq": 0, "ranks": wire}, None, self.groups).states
        except ValueError as error:
            return NodeView(report, {}), f"node {report.node_rank}: {error}"
        return NodeView(report, states), None


def _report_in_worker(data: bytes) -> bytes:
    """In a head's worker: a report decoded and its items checked, as plain data."""
    try:
        return sent((checked_rows(JSON.decode(data)), None))
    except (ValueError, RecursionError) as error:
        return sent((None, str(error)))


def _decode_in_worker(path: str) -> bytes:
    """In a worker: NodeFiles._decode of one file, as plain data."""
    node, problem = NodeFiles()._decode(path)
    if node is None:
        return sent((None, problem))
    return sent(((as_row(node.report), {rank: as_row(state) for rank, state in node.states.items()}),
                 problem))


def _node_from_worker(read: tuple) -> tuple[NodeView | None, str | None]:
    node, problem = read
    if node is None:
        return None, problem
    report, states = node
    return NodeView(built(NodeReport, report),
                    {rank: built(RankState, state) for rank, state in states.items()}), problem


def merge(snapshot: Snapshot, nodes: list[NodeView], notes: list[str]) -> Snapshot:
    """The head's snapshot with every other node's ranks and a NodeState for each;
    what could not be merged goes into notes."""
    reference = _reference_time(snapshot)
    for node in nodes:
        report = node.report
        for rank, state in node.states.items():
            if rank in snapshot.ranks:
                notes.append(f"node {report.node_rank}: rank {rank} is also on another node, "
                             f"skipped")
            else:
                snapshot.ranks[rank] = state
        snapshot.nodes.append(NodeState(
            node_rank=report.node_rank, host=report.host, ranks=sorted(node.states),
            last_seen=report.received_at, finished=report.finished,
            lost=_is_lost(report, reference)))
    snapshot.ranks = dict(sorted(snapshot.ranks.items()))
    snapshot.taken_at = _known_until(snapshot)
    return snapshot


def _known_until(snapshot: Snapshot) -> float:
    """The job is judged as of the oldest report of a node still reporting: past it,
    a late node's ranks would seem to stall while only their news is missing."""
    reports = [node.last_seen for node in snapshot.nodes
               if node.last_seen is not None and not (node.lost or node.finished)]
    return min([snapshot.taken_at] + reports)


def _reference_time(snapshot: Snapshot) -> float:
    """Now, while the head's own ranks still beat; else when they last did (post mortem);
    never past the head's stop, as of which a stopped job is judged."""
    beats = [state.heartbeat_at for state in snapshot.ranks.values()]
    if snapshot.driver:
        beats.append(snapshot.driver.heartbeat_at)
    reference = min(snapshot.taken_at, max(beats)) if beats else snapshot.taken_at
    return min(reference, snapshot.stop.at) if snapshot.stop is not None else reference


def _is_lost(report: NodeReport, reference: float) -> bool:
    """Lost as of `reference`, or as of when the head wrote the file it comes from:
    past that, a file that is not written again says nothing of the node."""
    if report.saved_at is not None:
        reference = min(reference, report.saved_at)
    if report.finished:
        return False
    if report.dropped:
        return True
    if report.received_at is None:
        return reference - report.expected_since > JOIN_GRACE_S
    heard = report.received_at
    if report.heard_at is not None and report.heard_at - heard < REPLY_S:
        heard = max(heard, report.heard_at)   # its news waits on the head, not on it
    return reference - heard > LOST_AFTER_S


# -- an agent ------------------------------------------------------------------

@dataclass
class HeadReply:
    verdicts: list[dict]
    dump: int
    stop: int | None              # end the command and exit with this code


class NodeAgent:
    """A node's launcher's line to the head; reconnects after a failure."""

    def __init__(self, head: str, key: bytes, node_rank: int,
                 ring_items: int | None = HEAD_RING_ITEMS):
        """ring_items: this node's share of the head's ring items a report (node_share)."""
        self.address = parse_address(head, "--head")
        self.key, self.node_rank = key, node_rank
        self.link: Link | None = None
        self.writer = ReportWriter(ring_items)
        self.note = "not connected yet"

    def publish(self, ranks: dict[int, RankState], command_exit: int | None, dump_done: int,
                finished: bool = False) -> HeadReply | None:
        """Send this node's ranks (what changed since the head's last); the head's
        answer, or None if it cannot be reached. NodeError if the head does not
        share this node's token."""
        try:
            link = self.link or self._connect()
            body = self.writer.report(ranks, time.time(), complete=finished)
            link.send(body | {"command_exit": command_exit, "dump_done": dump_done,
                              "finished": finished})
            reply = link.recv()
        except (OSError, EOFError, ValueError) as error:
            self.note = f"head {self.address[0]}:{self.address[1]} unreachable: {error}"
            self.close()
            return None
        self.writer.applied(reply.get("applied"))
        self.note = f"reporting to head {self.address[0]}:{self.address[1]}"
        stop = reply.get("stop")
        return HeadReply(reply.get("verdicts", []), int(reply.get("dump", 0)),
                         stop if isinstance(stop, int) else None)

    def _connect(self) -> Link:
        link = Link(socket.create_connection(self.address, timeout=HANDSHAKE_S), JSON,
                    AGENT_LIMITS)
        try:
            link.authenticate(self.key, challenge_first=False)
            link.send({"node_rank": self.node_rank, "host": socket.gethostname()})
            answer = link.recv()
        except HandshakeError as error:
            if error.wrong_key:
                raise NodeError(f"node {self.node_rank}: the head refused the token") from None
            raise ConnectionError(str(error)) from None
        except BaseException:
            link.close()
            raise
        if "error" in answer:
            link.close()
            raise NodeError(f"node {self.node_rank}: {answer['error']}")
        link.settle()
        self.link = link
        return link

    def close(self) -> None:
        self.writer.forget()
        if self.link is not None:
            self.link.close()
            self.link = None


def node_text(body: dict, ranks: dict[str, dict]) -> str:
    """A node file's JSON: the report's fields, and its ranks encoded one at a
    time. One json.dumps of a node of 1,024 ranks (4 MB and more) holds the GIL for
    about 0.1 s; sixteen nodes due at once held the head's poll off for 2.4 s
    right after a hang (#28). Between two ranks the head's other threads get their
    turn."""
    head = json.dumps(stamped(Document.NODE, body), default=str)
    encoded = ", ".join(f"{json.dumps(rank)}: {json.dumps(item, default=str)}"
                        for rank, item in ranks.items())
    return f'{head[:-1]}, "ranks": {{{encoded}}}}}'
