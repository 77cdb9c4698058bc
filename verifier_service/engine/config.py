"""The engine's one configuration object, built once at start-up and validated on construction."""
from __future__ import annotations

from dataclasses import dataclass

from specd.drafts import MAX_DRAFT_TOKENS, resolve_max_speculative_tokens
from specd.sampling import InvalidParameter

_DEVICES = ("auto", "cpu", "cuda")
_DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class EngineConfig:
    """What the engine and its model runner need to know.

    model: a Hugging Face checkpoint folder, or "default" (SmolLM2-135M-Instruct).
    block_size: tokens per KV block (the flash-attn path requires 256).
    kv_cache_bytes: the KV budget on the CPU; 0 = let the runner size it (free GPU memory on CUDA).
    kv_cache_memory_fraction: share of free GPU memory the runner may give the KV cache.
    max_model_len: prompt + output tokens per request; 0 = the model's own context length.
    num_speculative_tokens: drafts per step for requests that do not say (0 turns speculation off for them).
    max_speculative_tokens: the most drafts per step any request gets (a larger ask is clamped to it; usage
        reports the k a request ran with); CUDA graphs are captured for every step width up to it + 1.
        None = max(8, num_speculative_tokens).
    enforce_eager: never replay CUDA graphs (by default decode / verify steps on CUDA with flash-attn do).
    compile_model: torch.compile the decoder layers' attention-free regions on CUDA (never on the CPU).
    adaptive_drafting: draft in no step with more than max_draft_batch_size running requests
        (engine/draft_policy.py; False: every step may draft); output is unchanged either way.
    max_draft_batch_size: see adaptive_drafting (0 = no limit).
    draft_goodput: with adaptive_drafting, each step's drafts are capped where they stop paying in measured
        tokens a second at its batch size (engine/draft_policy.py). Off by default: not yet shown to pay.
    async_scheduling: schedule and launch the next step while the device runs this one (engine.py); None =
        on CUDA only (on the CPU the forward runs synchronously, so overlapping gains nothing).
    tensor_parallel_size: processes (one GPU each on CUDA) the model is sharded over (verifier_service/parallel/).
    random_weights: draw the weights at random instead of reading them (benchmarks; only config.json is read).
    deterministic: batch-invariant kernels (model_runner.py: fixed-row linears, attention/invariant.py on the CPU,
        model/invariant_layers.py and attention/triton_invariant.py on CUDA), so a token's logits do not depend on
        the batch, on the step's query tokens or on KV paging: greedy text is the same with and without
        speculation, alone or in any batch, run after run, in bfloat16 too. Tensor parallelism only on the CPU
        (all-reduces summed in rank order; on CUDA the runner refuses it).
    """

    model: str = "default"
    device: str = "auto"
    dtype: str = "auto"
    block_size: int = 16
    kv_cache_bytes: int = 256 * 2**20
    kv_cache_memory_fraction: float = 0.8
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int = 0
    num_speculative_tokens: int = 4
    max_speculative_tokens: int | None = None
    enable_prefix_caching: bool = True
    min_ngram: int = 1
    max_ngram: int = 4
    enforce_eager: bool = False
    compile_model: bool = True
    adaptive_drafting: bool = True
    max_draft_batch_size: int = 32
    draft_goodput: bool = False
    async_scheduling: bool | None = None
    tensor_parallel_size: int = 1
    random_weights: bool = False
    deterministic: bool = False

    def __post_init__(self) -> None:
        checks = [
            (bool(self.model), "model", "must name a checkpoint folder or 'default'"),
            (self.device in _DEVICES, "device", f"must be one of {_DEVICES}"),
            (self.dtype in _DTYPES, "dtype", f"must be one of {_DTYPES}"),
            (self.block_size >= 1, "block_size", "must be >= 1"),
            (self.kv_cache_bytes >= 0, "kv_cache_bytes", "must be >= 0 (0 = sized by the runner)"),
            (0.0 < self.kv_cache_memory_fraction <= 1.0, "kv_cache_memory_fraction", "must be in (0, 1]"),
            (self.max_num_seqs >= 1, "max_num_seqs", "must be >= 1"),
            (self.max_num_batched_tokens >= 1, "max_num_batched_tokens", "must be >= 1"),
            (self.max_model_len >= 0, "max_model_len", "must be >= 0 (0 = the model's own)"),
            (self.num_speculative_tokens >= 0, "num_speculative_tokens", "must be >= 0"),
            (self.max_speculative_tokens is None or self.num_speculative_tokens <= self.max_speculative_tokens
             <= MAX_DRAFT_TOKENS, "max_speculative_tokens",
             f"must be in [num_speculative_tokens, {MAX_DRAFT_TOKENS}]"),
            (self.max_draft_batch_size >= 0, "max_draft_batch_size", "must be >= 0 (0 = no limit)"),
            (1 <= self.min_ngram <= self.max_ngram, "min_ngram", "need 1 <= min_ngram <= max_ngram"),
            (self.tensor_parallel_size >= 1, "tensor_parallel_size", "must be >= 1"),
        ]
        for ok, name, message in checks:
            if not ok:
                raise InvalidParameter(name, message)

    @property
    def speculative_tokens_limit(self) -> int:
        """max_speculative_tokens, resolved (specd/drafts.py)."""
        return resolve_max_speculative_tokens(self.num_speculative_tokens, self.max_speculative_tokens)
