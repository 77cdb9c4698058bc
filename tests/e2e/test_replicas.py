"""Two verifier replicas behind one gateway share the load."""
from concurrent.futures import ThreadPoolExecutor

from bench.local_stack import metric_value
from support.e2e_clients import generate


def forward_passes(stack, name: str) -> float:
    return metric_value(stack.metrics_url(name), "specd_step_tokens_count")


def test_concurrent_requests_are_spread_over_both_replicas(stack):
    before = {name: forward_passes(stack, name) for name in ("verifier-0", "verifier-1")}
    prompts = [f"Write the number {i} in words, then count down from it:" for i in range(4)]
    with ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(lambda p: generate(stack.gateway_address, p, 16), prompts))
    assert all(len(r.token_ids) > 0 for r in results)
    for name, count in before.items():
        assert forward_passes(stack, name) > count, f"{name} served nothing"
