"""How many drafts a request may get per step: the one hard cap and the one default cap, shared by the CLI's
options, the verifier's engine config and the drafter so that no two of them can disagree.

Names for the count, each with one meaning: `num_speculative_tokens` (k) is what a request or the service asks
for per step; `max_speculative_tokens` caps that ask (--max-speculative-tokens; CUDA graphs are captured for every
step width up to it + 1; the engine config's `speculative_tokens_limit` is that cap resolved); a sequence's
`draft_limit` is the most drafts the verifier asks of the drafter for it in one step (the KV slots it holds for
them, `num_draft_slots`); `max_draft_tokens` is the drafter's cap on any draft limit; `num_draft_tokens` counts
draft tokens scored (per scheduled entry, per step, per request, and the metric
specd_spec_decode_num_draft_tokens_total).
"""
from __future__ import annotations

MAX_DRAFT_TOKENS = 32  # the most drafts per sequence and step anything takes: the drafter proposes no more
DEFAULT_MAX_SPECULATIVE_TOKENS = 8  # --max-speculative-tokens left unset is at least this


def resolve_max_speculative_tokens(num_speculative_tokens: int, max_speculative_tokens: int | None) -> int:
    """The cap on a request's k: the one given, else max(DEFAULT_MAX_SPECULATIVE_TOKENS, the default k), so a
    request may ask for somewhat more than the default without the operator saying so."""
    if max_speculative_tokens is not None:
        return max_speculative_tokens
    return max(DEFAULT_MAX_SPECULATIVE_TOKENS, num_speculative_tokens)
