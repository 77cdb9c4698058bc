"""specd_forward_passes_total{path}: forwards replayed from a decode / verify CUDA graph, from the model's captured
pieces, and run eagerly, as the runner reports them, through the verifier's real metrics exporter."""
from prometheus_client import CollectorRegistry

from support.engine_runs import run
from support.fake_runner import FakePagedRunner
from support.fake_workload import MAX_TOKENS, VOCAB, add_all
from verifier_service.engine.config import EngineConfig
from verifier_service.engine.engine import Engine
from verifier_service.metrics import VerifierMetrics, VerifierMetricsExporter


class DecodeGraphRunner(FakePagedRunner):
    """Reports a decode step (no prompt chunk) as replayed from a graph and other steps of up to PIECES_TOKENS tokens
    from the pieces, as ModelRunner does on CUDA."""

    def __init__(self) -> None:
        super().__init__(vocab_size=VOCAB)
        self.last_forward_path = "eager"
        self.forwards = {"graph": 0, "piecewise": 0, "eager": 0}

    def execute(self, batch):
        if all(r.start_position > 0 and r.num_logits == r.num_tokens for r in batch.requests):
            self.last_forward_path = "graph"
        else:
            self.last_forward_path = "piecewise" if batch.num_tokens <= PIECES_TOKENS else "eager"
        self.forwards[self.last_forward_path] += 1
        return super().execute(batch)


PIECES_TOKENS = 12


def forward_passes(registry: CollectorRegistry, path: str) -> float:
    return registry.get_sample_value("specd_forward_passes_total", {"path": path})


def test_the_exporter_counts_graph_piecewise_and_eager_forwards_as_the_runner_ran_them():
    registry = CollectorRegistry()
    exporter_metrics = VerifierMetrics(registry)
    assert all(forward_passes(registry, path) == 0 for path in ("graph", "piecewise", "eager"))  # from start-up
    runner = DecodeGraphRunner()
    engine = Engine(EngineConfig(num_speculative_tokens=0, max_num_batched_tokens=16), runner=runner)
    exporter = VerifierMetricsExporter(exporter_metrics)
    add_all(engine)
    outputs = run(engine)
    exporter.export(engine.take_step_stats(), engine.load(), 0)  # every step's stats, as the engine process sends them
    assert all(len(tokens) == MAX_TOKENS for tokens in outputs.values())
    assert all(count > 0 for count in runner.forwards.values())  # prompt chunks of either size, then decode steps
    for path, count in runner.forwards.items():
        assert forward_passes(registry, path) == count


def test_a_runner_that_says_nothing_counts_every_forward_as_eager():
    registry = CollectorRegistry()
    engine = Engine(EngineConfig(num_speculative_tokens=0), runner=FakePagedRunner(vocab_size=VOCAB))
    exporter = VerifierMetricsExporter(VerifierMetrics(registry))
    add_all(engine)
    run(engine)
    exporter.export(engine.take_step_stats(), engine.load(), 0)
    assert forward_passes(registry, "graph") == 0 and forward_passes(registry, "eager") > 0
