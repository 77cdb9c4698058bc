"""The gateway's Prometheus metrics (docs/PUBLIC_SURFACE.md), recorded from finished requests' RequestStats."""
from __future__ import annotations

import os

import grpc
import prometheus_client as prom
from prometheus_client import multiprocess

from gateway.request import FINISH_REASONS
from gateway.stats import RequestStats

# From a few ms (a warm GPU) to minutes (a long generation on a CPU).
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# Per-token gaps are much shorter than whole requests.
_INTER_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)


class GatewayMetrics:
    """The gateway's metrics in their own registry (so several gateways can live in one test process)."""

    def __init__(self, registry: prom.CollectorRegistry | None = None) -> None:
        self.registry = registry or prom.CollectorRegistry()
        r = self.registry
        self.time_to_first_token = prom.Histogram(
            "specd_time_to_first_token_seconds", "Arrival at the gateway to the first generated token",
            buckets=_LATENCY_BUCKETS, registry=r)
        self.inter_token_latency = prom.Histogram(
            "specd_inter_token_latency_seconds", "Time per generated token after the first",
            buckets=_INTER_TOKEN_BUCKETS, registry=r)
        self.e2e_request_latency = prom.Histogram(
            "specd_e2e_request_latency_seconds", "Arrival at the gateway to the last message",
            buckets=_LATENCY_BUCKETS, registry=r)
        self.request_queue_time = prom.Histogram(
            "specd_request_queue_time_seconds",
            "Arrival at the gateway to the dispatch to a verifier (tokenizing, routing, retries)",
            buckets=_LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = prom.Counter(
            "specd_prompt_tokens", "Prompt tokens of requests sent to verifiers", registry=r)
        self.generation_tokens = prom.Counter(
            "specd_generation_tokens", "Tokens generated for clients", registry=r)
        self.requests = prom.Counter(
            "specd_requests", "Finished requests by finish reason", ["finish_reason"], registry=r)
        self.request_errors = prom.Counter(
            "specd_request_errors", "Failed requests by grpc status code name", ["code"], registry=r)
        # Every series whose labels are known exists from start-up at 0 ("no errors" is not "no data").
        for finish_reason in FINISH_REASONS:
            self.requests.labels(finish_reason=finish_reason)
        for code in grpc.StatusCode:
            if code is not grpc.StatusCode.OK:
                self.request_errors.labels(code=code.name)

    def record(self, stats: RequestStats) -> None:
        """Adds one finished (or failed) request."""
        if stats.error_code:
            self.request_errors.labels(code=stats.error_code).inc()
        else:
            self.requests.labels(finish_reason=stats.finish_reason).inc()
        if stats.dispatch_time is None:
            return  # rejected before reaching a verifier: only the error counts
        self.request_queue_time.observe(stats.dispatch_time - stats.arrival_time)
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.generation_tokens.inc(stats.completion_tokens)
        if stats.first_token_time is not None:
            self.time_to_first_token.observe(stats.first_token_time - stats.arrival_time)
        for latency in stats.inter_token_latencies:
            self.inter_token_latency.observe(latency)
        if stats.finish_time is not None:
            self.e2e_request_latency.observe(stats.finish_time - stats.arrival_time)

    def count_rejected(self, code: str) -> None:
        """A request that ended before it started (bad input, unauthenticated, its deadline passed)."""
        self.request_errors.labels(code=code).inc()

    def exposition(self) -> tuple[bytes, str]:
        """The text exposition and its content type, for GET /metrics: with several gateway processes
        (gateway/processes.py) the sum over all of them, whichever one answers."""
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            registry = prom.CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return prom.generate_latest(registry), prom.CONTENT_TYPE_LATEST
        return prom.generate_latest(self.registry), prom.CONTENT_TYPE_LATEST
