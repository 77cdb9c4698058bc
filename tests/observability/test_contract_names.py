"""docs/PUBLIC_SURFACE.md's metric names, written out literally, are what the services expose (pinned here so a
rename in tests/support/specd_metrics.py cannot drift from the public surface unnoticed)."""
from support.specd_metrics import all_series_names

CONTRACT_SAMPLE_NAMES = {
    # verifier
    "specd_spec_decode_num_drafts_total", "specd_spec_decode_num_draft_tokens_total",
    "specd_spec_decode_num_accepted_tokens_total", "specd_spec_decode_num_emitted_tokens_total",
    "specd_spec_decode_num_accepted_tokens_per_pos_total", "specd_spec_decode_num_tree_nodes_total",
    "specd_step_stage_seconds_bucket",
    "specd_step_tokens_bucket", "specd_step_seconds_bucket", "specd_num_requests_running", "specd_num_requests_waiting",
    "specd_kv_cache_usage_ratio", "specd_num_preemptions_total", "specd_drafter_fallbacks_total",
    # gateway
    "specd_time_to_first_token_seconds_bucket", "specd_inter_token_latency_seconds_bucket",
    "specd_e2e_request_latency_seconds_bucket", "specd_request_queue_time_seconds_bucket",
    "specd_prompt_tokens_total", "specd_generation_tokens_total", "specd_requests_total",
    "specd_request_errors_total",
    # drafter
    "specd_drafter_propose_seconds_bucket", "specd_drafter_sequences", "specd_drafter_proposed_tokens_total",
    "specd_drafter_memory_tokens", "specd_drafter_draft_length_bucket",
}


def test_every_contract_metric_is_among_the_pinned_families():
    assert CONTRACT_SAMPLE_NAMES <= all_series_names()


def test_the_public_surface_document_names_every_pinned_metric_family_and_default_port():
    """docs/PUBLIC_SURFACE.md is the repository's own statement of what users may rely on: every family the
    services must expose is written there (counters with _total), and so are the default ports."""
    from pathlib import Path

    from specd.options import DRAFTER_PORTS, GATEWAY_PORTS, VERIFIER_PORTS
    from support.specd_metrics import DRAFTER_FAMILIES, GATEWAY_FAMILIES, VERIFIER_FAMILIES

    text = (Path(__file__).resolve().parents[2] / "docs" / "PUBLIC_SURFACE.md").read_text()
    for family, kind in {**VERIFIER_FAMILIES, **GATEWAY_FAMILIES, **DRAFTER_FAMILIES}.items():
        name = family + "_total" if kind == "counter" else family
        assert f"`{name}" in text, f"docs/PUBLIC_SURFACE.md does not name {name}"
    for grpc_port, http_port in (GATEWAY_PORTS, VERIFIER_PORTS, DRAFTER_PORTS):
        assert f"| {grpc_port} | {http_port}" in text
