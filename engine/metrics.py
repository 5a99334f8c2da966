"""The server's /metrics: Prometheus text exposition format (version 0.0.4), written by hand."""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from engine.scheduler import SchedulerStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


@dataclass
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)   # per bucket, not cumulative; last is +Inf
    total: float = 0.0

    def __post_init__(self):
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value


@dataclass
class ServerMetrics:
    """What the front end measures itself; the scheduler's counts come with each render."""
    time_to_first_token: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    inter_token_latency: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))


def render(model: str, stats: SchedulerStats, metrics: ServerMetrics) -> str:
    labels = f'model_name="{_escape(model)}"'
    lines: list[str] = []

    def sample(name: str, kind: str, help_text: str, value: float) -> None:
        lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}",
                      f"{name}{{{labels}}} {value}"])

    sample("engine_num_requests_running", "gauge", "Requests in the running batch.", stats.num_running)
    sample("engine_num_requests_waiting", "gauge", "Requests waiting to be scheduled.", stats.num_waiting)
    sample("engine_kv_cache_blocks_used", "gauge", "KV cache blocks held by requests.", stats.kv_blocks_used)
    sample("engine_kv_cache_blocks_free", "gauge", "KV cache blocks free (cached ones included).",
           stats.kv_blocks_free)
    sample("engine_num_preemptions_total", "counter", "Requests preempted.", stats.num_preemptions)
    sample("engine_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.",
           stats.prompt_tokens)
    sample("engine_generation_tokens_total", "counter", "Generated tokens.", stats.generation_tokens)
    _histogram(lines, "engine_time_to_first_token_seconds", "Time from request to first token.",
               labels, metrics.time_to_first_token)
    _histogram(lines, "engine_inter_token_latency_seconds", "Time between two tokens of a request.",
               labels, metrics.inter_token_latency)
    return "\n".join(lines) + "\n"


def _histogram(lines: list[str], name: str, help_text: str, labels: str, hist: Histogram) -> None:
    lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} histogram"])
    cumulative = 0
    for bound, count in zip([*map(repr, hist.bounds), "+Inf"], hist.counts):
        cumulative += count
        lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {cumulative}')
    lines.append(f"{name}_sum{{{labels}}} {hist.total}")
    lines.append(f"{name}_count{{{labels}}} {cumulative}")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
