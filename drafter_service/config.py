"""The drafter's settings: one frozen dataclass, validated once at start-up."""
from __future__ import annotations

from dataclasses import dataclass

from specd.drafts import MAX_DRAFT_TOKENS
from specd.options import DRAFTER_PORTS, ServiceOptions, drain
from specd.serving import TlsConfig

MEMORY_SCOPES = ("global", "per-key", "off")


@dataclass(frozen=True)
class DrafterConfig:
    """Service defaults and limits; a request's own n-gram bounds and draft count override them.

    The index of every sequence covers n-grams of length 1..max_ngram, so a request may ask for any
    bounds inside that range (others are clamped); min_ngram / max_ngram are the bounds used when a
    request leaves them 0. Memory with max_ngram = 4, in the native store (the default): about 125-170
    bytes per held token (126 measured with 64 sequences growing 5 tokens a step), so the default budget
    of 4M tokens is about 0.5-0.7 GB; the memory of earlier outputs about 170 per token (170 MB for the
    default 1M). The Python fallback store takes several times as much.
    """

    host: str = "0.0.0.0"
    port: int = 50071
    metrics_port: int | None = 9471
    tls: TlsConfig | None = None
    min_ngram: int = 1  # default shortest suffix to match
    max_ngram: int = 4  # default longest suffix to match, and the longest one indexed
    max_draft_tokens: int = MAX_DRAFT_TOKENS  # cap on a sequence's draft_limit (a bigger one gets this many)
    max_tokens_held: int = 4_000_000  # all sequences together; least recently used ones are evicted
    # The memory of earlier outputs (drafter_service/memory.py): what it may be shared across (global: every
    # request; per-key: requests of one tenant key; off: none), and its size; the oldest half is dropped
    # when it is full.
    memory_scope: str = "global"
    max_memory_tokens: int = 1_000_000
    # A draft stops before the token whose estimated chance of being accepted (with all before it) is
    # below this (drafter_service/evidence.py); 0 = always up to the sequence's draft_limit.
    min_draft_probability: float = 0.15
    # "evidence": the rule above; "ngram": plain prompt lookup, always k tokens from the own context (ngram.py),
    # the drafter before memory and evidence, kept for comparison (bench/acceptance.py).
    drafting: str = "evidence"
    grace_seconds: float = 5.0  # drain time on SIGTERM
    inject_delay_ms: int = 0  # testing aid (--inject-delay-ms): hold every reply this long, as a slow drafter

    def __post_init__(self) -> None:
        checks = [
            (1 <= self.min_ngram, "min_ngram", "must be >= 1"),
            (self.min_ngram <= self.max_ngram <= 64, "max_ngram", "must be in [min_ngram, 64]"),
            (self.max_draft_tokens >= 1, "max_draft_tokens", "must be >= 1"),
            (self.max_tokens_held >= 1, "max_tokens_held", "must be >= 1"),
            (self.memory_scope in MEMORY_SCOPES, "memory_scope", f"must be one of {', '.join(MEMORY_SCOPES)}"),
            (self.max_memory_tokens >= 2, "max_memory_tokens", "must be >= 2"),
            (0.0 <= self.min_draft_probability <= 1.0, "min_draft_probability", "must be in [0, 1]"),
            (self.drafting in ("evidence", "ngram"), "drafting", "must be 'evidence' or 'ngram'"),
            (0 <= self.port <= 65535, "port", "must be a TCP port"),
            (self.metrics_port is None or 0 <= self.metrics_port <= 65535, "metrics_port",
             "must be a TCP port"),
            (self.grace_seconds >= 0, "grace_seconds", "must be >= 0"),
            (self.inject_delay_ms >= 0, "inject_delay_ms", "must be >= 0"),
        ]
        for ok, name, message in checks:
            if not ok:
                raise ValueError(f"{name}: {message}")


def drafter_config_from_options(options: ServiceOptions) -> DrafterConfig:
    """The drafter holds no model: where it listens, and what its memory keeps."""
    defaults = DrafterConfig()
    return DrafterConfig(
        host=options.host,
        port=DRAFTER_PORTS[0] if options.port is None else options.port,
        metrics_port=DRAFTER_PORTS[1] if options.metrics_port is None else options.metrics_port,
        tls=TlsConfig(options.tls_cert, options.tls_key, options.tls_ca) if options.tls_cert else None,
        inject_delay_ms=options.inject_delay_ms,
        memory_scope=options.draft_memory_scope,
        max_memory_tokens=options.draft_memory_tokens or defaults.max_memory_tokens,
        min_draft_probability=(defaults.min_draft_probability if options.draft_min_probability is None
                               else options.draft_min_probability),
        drafting=options.drafting,
        **drain(options),
    )
