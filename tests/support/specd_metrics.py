"""The Prometheus metric families docs/PUBLIC_SURFACE.md promises, per service, with their types."""
from __future__ import annotations

VERIFIER_FAMILIES = {
    "specd_spec_decode_num_drafts": "counter",
    "specd_spec_decode_num_draft_tokens": "counter",
    "specd_spec_decode_num_accepted_tokens": "counter",
    "specd_spec_decode_num_emitted_tokens": "counter",
    "specd_spec_decode_num_accepted_tokens_per_pos": "counter",  # label: position
    "specd_spec_decode_num_tree_nodes": "counter",  # 0: draft trees are not served
    "specd_step_stage_seconds": "histogram",  # label: stage
    "specd_step_tokens": "histogram",
    "specd_step_seconds": "histogram",  # one observation per step (stalls)
    "specd_step_stalls": "counter",  # beyond docs/PUBLIC_SURFACE.md: steps over 10x their kind's median
    "specd_verifier_time_to_first_token_seconds": "histogram",  # a request's arrival here to its first tokens out
    "specd_num_requests_running": "gauge",
    "specd_num_requests_waiting": "gauge",
    "specd_kv_cache_usage_ratio": "gauge",
    "specd_num_preemptions": "counter",
    "specd_drafter_fallbacks": "counter",
    "specd_drafter_context_drafts": "counter",  # beyond docs/PUBLIC_SURFACE.md's list: the link's own drafts
    "specd_drafter_unasked_steps": "counter",  # beyond docs/PUBLIC_SURFACE.md's list: steps the link did not ask
    "specd_steps_scheduled_ahead": "counter",  # beyond docs/PUBLIC_SURFACE.md: async scheduling
    "specd_forward_passes": "counter",  # beyond docs/PUBLIC_SURFACE.md: label path (graph | eager)
}
GATEWAY_FAMILIES = {
    "specd_time_to_first_token_seconds": "histogram",
    "specd_inter_token_latency_seconds": "histogram",
    "specd_e2e_request_latency_seconds": "histogram",
    "specd_request_queue_time_seconds": "histogram",
    "specd_prompt_tokens": "counter",
    "specd_generation_tokens": "counter",
    "specd_requests": "counter",  # label: finish_reason
    "specd_request_errors": "counter",  # label: code
}
DRAFTER_FAMILIES = {
    "specd_drafter_propose_seconds": "histogram",
    "specd_drafter_sequences": "gauge",
    "specd_drafter_proposed_tokens": "counter",  # label: source (context | memory)
    "specd_drafter_memory_tokens": "gauge",
    "specd_drafter_draft_length": "histogram",
}
# Stages docs/PUBLIC_SURFACE.md requires of specd_step_stage_seconds{stage}.
REQUIRED_STAGES = {"propose", "score", "verify", "schedule"}


def exposed_series_names(family: str, kind: str) -> set[str]:
    """Names a family's samples carry in the text format (counters gain _total, histograms _bucket...)."""
    if kind == "counter":
        return {family + "_total"}
    if kind == "histogram":
        return {family + "_bucket", family + "_sum", family + "_count"}
    return {family}


def all_series_names() -> set[str]:
    """Every sample name the three services must expose."""
    families = {**VERIFIER_FAMILIES, **GATEWAY_FAMILIES, **DRAFTER_FAMILIES}
    return set().union(*(exposed_series_names(f, k) for f, k in families.items()))
