"""specd/drafts.py: the one cap on drafts per step and the one default for --max-speculative-tokens."""
from drafter_service.config import DrafterConfig
from specd.drafts import DEFAULT_MAX_SPECULATIVE_TOKENS, MAX_DRAFT_TOKENS, resolve_max_speculative_tokens
from verifier_service.engine.config import EngineConfig


def test_a_given_cap_is_kept_and_an_unset_one_is_at_least_the_default():
    assert resolve_max_speculative_tokens(4, 5) == 5
    assert resolve_max_speculative_tokens(4, None) == DEFAULT_MAX_SPECULATIVE_TOKENS
    assert resolve_max_speculative_tokens(12, None) == 12


def test_the_engine_and_the_drafter_share_the_cap():
    assert EngineConfig(num_speculative_tokens=4).speculative_tokens_limit == resolve_max_speculative_tokens(4, None)
    assert DrafterConfig().max_draft_tokens == MAX_DRAFT_TOKENS
    EngineConfig(max_speculative_tokens=MAX_DRAFT_TOKENS)  # the cap itself is allowed
