"""The server's Prometheus metrics (``GET /metrics``), on a registry of its own per app.

    llcinfer_requests_total{endpoint, outcome}     ok | timeout | disconnected | error |
                                                   rejected (429) | invalid (other 4xx)
    llcinfer_prompt_tokens_total, llcinfer_generation_tokens_total
    llcinfer_time_to_first_token_seconds           histogram, submission to first token
    llcinfer_time_per_output_token_seconds         histogram, per choice with >= 2 tokens
    llcinfer_requests_waiting, llcinfer_requests_running    the scheduler's queues
    llcinfer_requests_in_flight                    admitted by the server, not yet answered
    llcinfer_kv_blocks_in_use                      blocks live requests hold
    llcinfer_kv_blocks_cached, llcinfer_kv_blocks_retained, llcinfer_kv_blocks_capacity

The gauges are read from the engine when scraped, without stopping it (exact when idle).
"""

from __future__ import annotations

from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..api import LLM
from ..engine.request import GenerationStats

_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)


class _EngineGauges(Collector):
    """Queue and KV gauges, read from the engine at each scrape."""

    def __init__(self, llm: LLM, in_flight: Callable[[], int]):
        self.llm, self.in_flight = llm, in_flight

    def collect(self):
        sched = self.llm.engine.scheduler
        kv = self.llm.kv_stats()
        values = [
            ("llcinfer_requests_waiting", "Requests waiting for a sequence (the queue depth)", len(sched.waiting)),
            ("llcinfer_requests_running", "Requests holding a sequence", len(sched.running)),
            ("llcinfer_requests_in_flight", "Sequences admitted by the server and not yet answered", self.in_flight()),
            ("llcinfer_kv_blocks_in_use", "KV blocks held by live requests", kv["in_use_blocks"]),
            ("llcinfer_kv_blocks_cached", "KV blocks kept for prefix reuse (evictable)", kv["cached_blocks"]),
            ("llcinfer_kv_blocks_retained", "KV blocks of the last finished request, kept for its next turn",
             kv["retained_blocks"]),
            ("llcinfer_kv_blocks_capacity", "Most KV blocks the budget allows", kv["capacity_blocks"]),
        ]
        for name, doc, value in values:
            yield GaugeMetricFamily(name, doc, value=value)


class Metrics:
    """The counters and histograms the app updates, and the engine gauges."""

    def __init__(self, llm: LLM, in_flight: Callable[[], int]):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("llcinfer_requests", "API requests by endpoint and outcome",
                                ["endpoint", "outcome"], registry=r)
        self.prompt_tokens = Counter("llcinfer_prompt_tokens", "Prompt tokens submitted", registry=r)
        self.generation_tokens = Counter("llcinfer_generation_tokens", "Tokens generated", registry=r)
        self.ttft = Histogram("llcinfer_time_to_first_token_seconds", "Submission to first token",
                              buckets=_TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("llcinfer_time_per_output_token_seconds", "Decode time per token after the first",
                              buckets=_TPOT_BUCKETS, registry=r)
        r.register(_EngineGauges(llm, in_flight))

    def finished(self, endpoint: str, outcome: str, stats: list[GenerationStats]) -> None:
        """Count one answered request and the timings of its choices."""
        self.requests.labels(endpoint, outcome).inc()
        if stats:
            self.prompt_tokens.inc(stats[0].n_prompt)  # the samples of n share one prompt
        for s in stats:
            self.generation_tokens.inc(s.n_generated)
            if s.n_generated >= 1:
                self.ttft.observe(s.ttft_s)
            if s.n_generated >= 2:
                self.tpot.observe(s.tpot_ms / 1e3)

    def exposition(self) -> tuple[bytes, str]:
        """The text format and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
