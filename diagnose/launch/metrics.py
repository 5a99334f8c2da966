"""`diag launch --metrics-port`: Prometheus metrics and a health endpoint for the
job it watches, on one port (docs/metrics.md).

GET /metrics is Prometheus' text format, built at each scrape from what the
launcher's last poll saw; GET /health answers 503 with the verdict's one line
while a hang is named, 200 otherwise, so a Kubernetes livenessProbe or a load
balancer sees the hang that the job's own /health does not. The launcher's
thread publishes a new View after each poll (one reference, swapped whole); the
server's threads only read it.
"""
from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from diagnose.analysis.activity import classify
from diagnose.analysis.position import current_step, last_progress, phase_name
from diagnose.core.snapshot import Snapshot, Verdict
from diagnose.core.vocab import HANG_KINDS

PREFIX = "hangscope_"


@dataclass
class View:
    """What the last poll saw, and what diag has said so far."""
    snapshot: Snapshot | None = None
    verdicts: list[Verdict] = field(default_factory=list)
    verdicts_seen: dict[str, int] = field(default_factory=dict)   # kind -> verdicts so far
    poll_seconds: float = 0.0
    polled_at: float = 0.0

    @property
    def hangs(self) -> list[Verdict]:
        return [verdict for verdict in self.verdicts if verdict.kind in HANG_KINDS]


def health(view: View) -> tuple[int, str]:
    """(HTTP status, one line): 503 with the first named hang's line, else 200."""
    hangs = view.hangs
    if hangs:
        return 503, f"hang: {hangs[0].kind}: {' '.join(hangs[0].summary.split())}"
    if view.snapshot is None:
        return 200, "ok: no rank has started yet"
    return 200, f"ok: {len(view.snapshot.ranks)} rank(s), no hang"


class _Families:
    """prometheus_client's custom-collector hook: the families of the current View."""

    def __init__(self, monitor: Monitor):
        self.monitor = monitor

    def collect(self):
        view = self.monitor.view
        yield from _hang_families(view)
        yield from _rank_families(view.snapshot)
        yield from _diag_families(view)


def _gauge(name: str, text: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, text, labels=labels)


def _hang_families(view: View):
    hung = _gauge("hung", "1 while diag names a hang (any kind), else 0")
    hung.add_metric([], 1.0 if view.hangs else 0.0)
    hang = _gauge("hang", "1 for each culprit rank of each hang diag names now (no series "
                  "while healthy)", ["kind", "culprit_rank"])
    for verdict in view.hangs:
        for rank in verdict.culprit_ranks or [-1]:
            hang.add_metric([str(verdict.kind), str(rank)], 1.0)
    verdicts = CounterMetricFamily(PREFIX + "verdicts", "verdicts diag has named so far, by "
                                   "kind (one per kind and culprit)", labels=["kind"])
    for kind, count in sorted(view.verdicts_seen.items()):
        verdicts.add_metric([kind], float(count))
    return [hung, hang, verdicts]


def _rank_families(snapshot: Snapshot | None):
    age = _gauge("progress_age_seconds", "seconds since the newest progress of any rank "
                 "(a phase boundary or a collective)")
    step = _gauge("rank_step", "the step the rank is in or last finished", ["rank"])
    phase = _gauge("rank_phase", "1 for the phase the rank is in now", ["rank", "phase"])
    beat = _gauge("rank_heartbeat_age_seconds", "seconds since the rank's probe last beat",
                  ["rank"])
    alive = _gauge("rank_alive", "1 while the rank's process runs", ["rank"])
    activity = _gauge("rank_activity", "1 for what the rank's main thread does now, read from "
                      "its current frame (collective, gpu_wait, idle, compiling, sleeping, "
                      "running, unknown)", ["rank", "activity"])
    families = [age, step, phase, beat, alive, activity]
    if snapshot is None or not snapshot.ranks:
        return families
    now = snapshot.taken_at
    age.add_metric([], max(0.0, now - max(map(last_progress, snapshot.ranks.values()))))
    for rank, state in snapshot.ranks.items():
        label = [str(rank)]
        if current_step(state) is not None:
            step.add_metric(label, float(current_step(state)))
        phase.add_metric(label + [phase_name(state) or "none"], 1.0)
        beat.add_metric(label, max(0.0, now - state.heartbeat_at))
        alive.add_metric(label, 1.0 if state.alive else 0.0)
        doing = classify([state.frame] if state.frame else []).activity
        activity.add_metric(label + [str(doing)], 1.0)
    return families


def _diag_families(view: View):
    snapshot = view.snapshot
    ranks = _gauge("ranks", "ranks whose probe file diag reads")
    unreadable = _gauge("probe_unreadable_files", "probe files diag could not read at its "
                        "last poll (the probe's own health)")
    took = _gauge("poll_duration_seconds", "how long diag's last poll of the run dir and "
                  "analysis took")
    polled = _gauge("last_poll_timestamp_seconds", "when diag last polled (Unix time): a "
                    "stale value means diag itself is stuck")
    ranks.add_metric([], float(len(snapshot.ranks)) if snapshot else 0.0)
    unreadable.add_metric([], float(len(snapshot.notes) + len(snapshot.unreadable))
                          if snapshot else 0.0)
    took.add_metric([], view.poll_seconds)
    polled.add_metric([], view.polled_at)
    return [ranks, unreadable, took, polled]


class MonitorError(Exception):
    """The port cannot be served: one line says why."""


class Monitor:
    """The HTTP server of /metrics and /health, in threads of its own."""

    def __init__(self, host: str, port: int):
        self.view = View()
        self.counted: set[tuple] = set()
        self.seen: dict[str, int] = {}          # kind -> verdicts named so far
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Families(self))
        try:
            self.server = ThreadingHTTPServer((host, port), _handler(self))
        except OSError as error:
            raise MonitorError(f"--metrics-port {port}: cannot listen on {host}:{port}: "
                               f"{error.strerror}") from None
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="diag-metrics",
                                       daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def publish(self, snapshot: Snapshot, verdicts: list[Verdict], key,
                poll_seconds: float) -> None:
        """The launcher's last poll; `key` tells a new verdict from one already counted."""
        for verdict in verdicts:
            if key(verdict) not in self.counted:
                self.counted.add(key(verdict))
                self.seen[str(verdict.kind)] = self.seen.get(str(verdict.kind), 0) + 1
        self.view = View(snapshot, list(verdicts), dict(self.seen), poll_seconds, time.time())

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _handler(monitor: Monitor):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._reply(200, generate_latest(monitor.registry), CONTENT_TYPE_LATEST)
            elif path in ("/health", "/healthz"):
                status, line = health(monitor.view)
                self._reply(status, (line + "\n").encode(), "text/plain; charset=utf-8")
            else:
                self._reply(404, b"not found: /metrics or /health\n", "text/plain")

        def _reply(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format, *args):
            pass    # a scrape a second must not reach the job's terminal
    return Handler


def start_monitor(host: str, port: int) -> Monitor:
    """The server, started, and one line that says where."""
    monitor = Monitor(host, port)
    print(f"diag: metrics at {monitor.url}/metrics, health at {monitor.url}/health",
          file=sys.stderr)
    return monitor
