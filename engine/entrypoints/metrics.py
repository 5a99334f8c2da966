"""The server's /metrics, through prometheus_client, with vLLM's names, units, labels and
histogram buckets (vllm/v1/metrics/loggers.py and buckets.py of vLLM 0.32), so that
dashboards made for vLLM read this server too.

Each server has its own CollectorRegistry. The scheduler's counts are read when
/metrics is scraped; the latencies are observed by the front end as tokens arrive.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from engine.core.scheduler import SchedulerStats

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
FINISH_REASONS = ("stop", "length", "abort", "error")   # vLLM's, but repetition (never here)
LABELS = ("model_name", "engine")                       # engine: vLLM's engine index, always 0


class _SchedulerCollector(Collector):
    """The scheduler's gauges and counters, as of the last engine step."""

    def __init__(self, stats: Callable[[], SchedulerStats], labels: list[str]):
        self.stats = stats
        self.labels = labels

    def collect(self) -> Iterator[Metric]:
        s = self.stats()
        blocks = s.kv_blocks_used + s.kv_blocks_free
        for family, name, text, value in [
            (GaugeMetricFamily, "vllm:num_requests_running", "Number of requests in model execution "
             "batches.", s.num_running),
            (GaugeMetricFamily, "vllm:num_requests_waiting", "Number of requests waiting to be "
             "processed.", s.num_waiting),
            (GaugeMetricFamily, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent "
             "usage.", s.kv_blocks_used / blocks if blocks else 0.0),
            (CounterMetricFamily, "vllm:num_preemptions", "Cumulative number of preemption from "
             "the engine.", s.num_preemptions),
            (CounterMetricFamily, "vllm:prompt_tokens", "Number of prefill tokens processed.",
             s.prompt_tokens),
            (CounterMetricFamily, "vllm:generation_tokens", "Number of generation tokens processed.",
             s.generation_tokens),
            (CounterMetricFamily, "vllm:prefix_cache_queries", "Prefix cache queries, in terms of "
             "number of queried tokens.", s.prefix_cache_queries),
            (CounterMetricFamily, "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number "
             "of cached tokens.", s.prefix_cache_hits),
        ]:
            metric = family(name, text, labels=LABELS)
            metric.add_metric(self.labels, value)
            yield metric


class ServerMetrics:
    """One server's metrics: what the front end observes, and the scheduler's, read at scrape."""

    def __init__(self, model_name: str, stats: Callable[[], SchedulerStats]):
        self.registry = CollectorRegistry()
        labels = [model_name, "0"]
        self.registry.register(_SchedulerCollector(stats, labels))

        def histogram(name: str, text: str, buckets: tuple[float, ...]):
            return Histogram(name, text, LABELS, buckets=buckets, registry=self.registry).labels(*labels)

        self.time_to_first_token = histogram("vllm:time_to_first_token_seconds",
                                             "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.inter_token_latency = histogram("vllm:inter_token_latency_seconds",
                                             "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.e2e_request_latency = histogram("vllm:e2e_request_latency_seconds",
                                             "Histogram of e2e request latency in seconds.",
                                             REQUEST_LATENCY_BUCKETS)
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          [*LABELS, "finished_reason"], registry=self.registry)
        self.request_success = {reason: success.labels(*labels, reason) for reason in FINISH_REASONS}

    def render(self, accept: str) -> tuple[bytes, str]:
        """The exposition a scraper's Accept header asks for (Prometheus text 0.0.4 if none),
        and its content type."""
        encode, content_type = choose_encoder(accept)
        return encode(self.registry), content_type
