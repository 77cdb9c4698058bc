"""The verifier's Prometheus metrics (docs/OPERATIONS.md, Observability), filled by an exporter that reads stats objects.

The engine only counts (its stats objects); the drafter client only counts its fallbacks (and its link the steps it
drafted itself). The engine process sends them to the serving process with each step's outputs (engine_process.py),
where `VerifierMetricsExporter.export()` turns them into counter increments and histogram observations, and the
load into gauges: nothing here runs on the engine's thread, let alone inside the step.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from verifier_service.spec_decode_log import SpecDecodeIntervalLog
from verifier_service.step_stall_log import StepStallLog

STEP_STAGES = ("schedule", "propose", "score", "verify", "update")
FORWARD_PATHS = ("graph", "piecewise", "eager")  # how a forward ran: ModelRunner.last_forward_path
_STAGE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# Whole steps: a small model's decode step on a GPU takes well under a millisecond, a stall tens of them or more.
_STEP_BUCKETS = (0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25,
                 0.5, 1.0, 2.5, 5.0)
_FIRST_TOKEN_BUCKETS = (0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


class VerifierMetrics:
    """Every verifier metric family, registered on `registry`."""

    def __init__(self, registry: CollectorRegistry, max_speculative_tokens: int = 0) -> None:
        """`max_speculative_tokens`: the most drafts a step may score (--max-speculative-tokens); their
        per-position series, like every stage's, exist from start-up at 0."""
        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(f"specd_{name}", doc, labels, registry=registry)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"specd_{name}", doc, registry=registry)

        self.num_drafts = counter("spec_decode_num_drafts", "Draft sequences scored (one per request per step with drafts).")
        self.num_draft_tokens = counter("spec_decode_num_draft_tokens", "Draft tokens scored by the target model.")
        self.num_accepted_tokens = counter("spec_decode_num_accepted_tokens", "Draft tokens accepted by verification.")
        self.num_emitted_tokens = counter("spec_decode_num_emitted_tokens",
                                          "Tokens emitted by steps that scored drafts (accepted + recovered/bonus).")
        # The verifier scores draft chains only: draft trees are measured in replay and not served (drafter_service/
        # tree.py, docs/BENCHMARKS.md round 23), so this family stays at 0 until a tree verifier increments it.
        self.num_tree_nodes = counter("spec_decode_num_tree_nodes", "Draft-tree nodes scored by the target model "
                                      "(0: the verifier scores draft chains only; trees are not served).")
        self.num_accepted_tokens_per_pos = counter("spec_decode_num_accepted_tokens_per_pos",
                                                   "Accepted draft tokens by draft position (0 = first).", ("position",))
        self.step_stage_seconds = Histogram("specd_step_stage_seconds", "Time per engine step stage.", ("stage",),
                                            buckets=_STAGE_BUCKETS, registry=registry)
        self.step_seconds = Histogram("specd_step_seconds", "Time per engine step, whatever its stages (one "
                                      "observation per step: a step far above the median is a stall).",
                                      buckets=_STEP_BUCKETS, registry=registry)
        self.step_stalls = counter("step_stalls", "Engine steps over 10x the recent median of their kind (decode / "
                                   "verify steps, or steps with a prompt chunk), each logged with its widths and stages.")
        self.step_tokens = Histogram("specd_step_tokens", "Tokens fed to the model per forward pass.",
                                     buckets=_TOKEN_BUCKETS, registry=registry)
        self.time_to_first_token = Histogram(
            "specd_verifier_time_to_first_token_seconds", "Seconds from a request's arrival at the verifier to its "
            "first tokens leaving it: the gateway's time to first token less the gateway and the network.",
            buckets=_FIRST_TOKEN_BUCKETS, registry=registry)
        self.forward_passes = counter("forward_passes", "Forward passes of the target model by how they ran: "
                                      "path=graph replayed a decode / verify step's CUDA graph, path=piecewise the "
                                      "model's captured pieces around eager attention (prompt chunks, mixed and "
                                      "large batches), path=eager neither (the CPU, steps beyond the pieces' "
                                      "largest bucket, --enforce-eager).", ("path",))
        self.num_requests_running = gauge("num_requests_running", "Requests in the running batch.")
        self.num_requests_waiting = gauge("num_requests_waiting", "Requests waiting for KV blocks or a batch slot.")
        self.kv_cache_usage_ratio = gauge("kv_cache_usage_ratio", "Fraction of KV cache blocks in use (0..1).")
        self.num_preemptions = counter("num_preemptions", "Requests preempted to free KV blocks.")
        self.drafter_fallbacks = counter("drafter_fallbacks",
                                         "Steps decoded without the drafter's drafts because it failed or was late "
                                         "(specd_drafter_context_drafts_total of them drafted from the requests' "
                                         "own contexts instead).")
        self.drafter_context_drafts = counter("drafter_context_drafts",
                                              "Steps the drafter's answer missed that the verifier drafted from the "
                                              "requests' own contexts instead (the verifier's own copy of them, "
                                              "the drafter link's on CUDA; no memory of earlier outputs).")
        self.drafter_unasked_steps = counter("drafter_unasked_steps",
                                             "Steps whose drafts the drafter link took from the requests' own "
                                             "contexts without asking the drafter service, which had added nothing "
                                             "for them lately (SPECD_DRAFTER_PROBE_STEPS above 1).")
        self.steps_scheduled_ahead = counter("steps_scheduled_ahead",
                                             "Steps that launched the next step before their own tokens reached "
                                             "the host (async scheduling).")
        for stage in STEP_STAGES:
            self.step_stage_seconds.labels(stage=stage)
        for path in FORWARD_PATHS:
            self.forward_passes.labels(path=path)
        for position in range(max_speculative_tokens):
            self.num_accepted_tokens_per_pos.labels(position=str(position))


class VerifierMetricsExporter:
    """Turns the engine's step stats, its load and the drafter client's fallback total into metrics."""

    def __init__(self, metrics: VerifierMetrics, interval_log: SpecDecodeIntervalLog | None = None,
                 stall_log: StepStallLog | None = None) -> None:
        self._metrics = metrics
        self._exported = [0, 0, 0]  # the drafter counts exported so far: fallbacks, context drafts, unasked steps
        self._interval_log = interval_log if interval_log is not None else SpecDecodeIntervalLog()
        self._stall_log = stall_log if stall_log is not None else StepStallLog()

    def export(self, steps: list, load, fallbacks: int, context_drafts: int = 0, unasked: int = 0) -> None:
        """The steps' stats since the last call, the load now, and the proposer's running totals of fallbacks, of
        steps drafted from the link's own contexts after missing the service, and of steps it did not ask."""
        for step in steps:
            self._export_step(step)
        counters = (self._metrics.drafter_fallbacks, self._metrics.drafter_context_drafts,
                    self._metrics.drafter_unasked_steps)
        for index, (counter, total) in enumerate(zip(counters, (fallbacks, context_drafts, unasked))):
            if total > self._exported[index]:
                counter.inc(total - self._exported[index])
                self._exported[index] = total
        self._export_load(load)

    def _export_step(self, step) -> None:
        metrics = self._metrics
        metrics.step_seconds.observe(step.seconds)
        if self._stall_log.observe(step):
            metrics.step_stalls.inc()
        for stage, seconds in step.stage_seconds.items():
            metrics.step_stage_seconds.labels(stage=stage).observe(seconds)
        for num_tokens in step.forward_tokens:  # one observation per forward pass
            metrics.step_tokens.observe(num_tokens)
        eager = len(step.forward_tokens) - step.num_graph_replays - step.num_piecewise_replays
        for path, count in zip(FORWARD_PATHS, (step.num_graph_replays, step.num_piecewise_replays, eager)):
            if count:
                metrics.forward_passes.labels(path=path).inc(count)
        spec = step.spec_decoding
        self._interval_log.observe(spec)
        if spec is not None and spec.num_drafts:
            metrics.num_drafts.inc(spec.num_drafts)
            metrics.num_draft_tokens.inc(spec.num_draft_tokens)
            metrics.num_accepted_tokens.inc(spec.num_accepted_tokens)
            metrics.num_emitted_tokens.inc(spec.num_emitted_tokens)
            for position, count in enumerate(spec.num_accepted_tokens_per_pos):
                if count:
                    metrics.num_accepted_tokens_per_pos.labels(position=str(position)).inc(count)
        if step.num_preemptions:
            metrics.num_preemptions.inc(step.num_preemptions)
        if step.scheduled_ahead:
            metrics.steps_scheduled_ahead.inc()

    def _export_load(self, load) -> None:
        self._metrics.num_requests_running.set(load.num_running)
        self._metrics.num_requests_waiting.set(load.num_waiting)
        self._metrics.kv_cache_usage_ratio.set(load.kv_cache_usage)
