"""GatewayConfig refuses bad values naming them; metrics are filled from per-request stats."""
import pytest

from gateway.config import GatewayConfig
from gateway.metrics import GatewayMetrics
from gateway.stats import RequestStats


@pytest.mark.parametrize("fields,name", [
    ({"verifier_addrs": ()}, "verifier_addrs"),
    ({"verifier_addrs": ("localhost",)}, "verifier_addrs"),
    ({"verifier_addrs": ("localhost:99999",)}, "verifier_addrs"),
    ({"grpc_port": -1}, "grpc_port"),
    ({"http_port": 70000}, "http_port"),
    ({"api_key": ""}, "api_key"),
    ({"max_model_len": 1}, "max_model_len"),
    ({"health_poll_seconds": 0}, "health_poll_seconds"),
])
def test_bad_config_values_are_refused_naming_them(fields, name):
    with pytest.raises(ValueError, match=f"^{name}: "):
        GatewayConfig(model_path="/models/x", **fields)


def test_defaults_match_the_contract_ports():
    config = GatewayConfig(model_path="/models/x")
    assert (config.grpc_port, config.http_port, config.verifier_addrs) == (50051, 8000, ("127.0.0.1:50061",))


def sample(metrics, name, labels=None):
    return metrics.registry.get_sample_value(name, labels or {})


def test_a_speculative_step_splits_its_gap_over_its_tokens():
    stats = RequestStats(arrival_time=0.0)
    stats.tokens_arrived(1)
    stats.last_token_time -= 0.3  # pretend the next step came 0.3 s later
    stats.tokens_arrived(3)
    assert stats.completion_tokens == 4
    assert stats.inter_token_latencies == pytest.approx([0.1, 0.1, 0.1], abs=0.01)


def test_a_finished_request_fills_every_gateway_metric():
    metrics = GatewayMetrics()
    stats = RequestStats(arrival_time=0.0, prompt_tokens=5)
    stats.dispatch_time = 0.01
    stats.tokens_arrived(1)
    stats.tokens_arrived(2)
    stats.finished("length")
    metrics.record(stats)
    assert sample(metrics, "specd_prompt_tokens_total") == 5
    assert sample(metrics, "specd_generation_tokens_total") == 3
    assert sample(metrics, "specd_requests_total", {"finish_reason": "length"}) == 1
    assert sample(metrics, "specd_inter_token_latency_seconds_count") == 2
    for name in ("time_to_first_token", "e2e_request_latency", "request_queue_time"):
        assert sample(metrics, f"specd_{name}_seconds_count") == 1


def test_a_failed_request_counts_only_as_an_error():
    metrics = GatewayMetrics()
    stats = RequestStats()
    stats.finished(error_code="UNAVAILABLE")
    metrics.record(stats)
    assert sample(metrics, "specd_request_errors_total", {"code": "UNAVAILABLE"}) == 1
    assert sample(metrics, "specd_e2e_request_latency_seconds_count") == 0
