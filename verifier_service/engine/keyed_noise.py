"""Random numbers keyed by (seed, output position, token): the same key gives the same number anywhere.

A sampled request picks the token at output position p as argmax_v probs[v] / E(seed, p, v), with E an
Exp(1) variable per token (the exponential race: the winner is a draw from probs, exactly). The race runs in
logs, argmax_v score[v] - log E(seed, p, v), on scores = log probs plus any per-row constant (logits / T, with
-inf where top-k / top-p / min-p remove a token: sampling.filter_logits), so no softmax is needed (-log E is
Gumbel noise: the Gumbel-max trick). Drawing E from a stateful generator ties the draw to how many numbers
were drawn before - which depends on the batch, the steps, the drafts tried. Here E is a pure function of its
key instead, computed by a counter-based hash (SplitMix64, Steele et al., "Fast splittable pseudorandom number
generators", OOPSLA 2014):
    row key   = mix(mix(seed ^ SEED_SALT) + (p + 1) * GAMMA)       one per (request, position) row
    bits      = mix(row key + (v + 1) * GAMMA)                      one per token: SplitMix64's stream
    u         = (top 24 bits of bits + 1) / 2**24                  in (0, 1], a float32 exactly
    E         = -log(u), at least 2**-25                            Exp(1); never 0 (0 / 0 would be NaN)
so the row keys of one seed are SplitMix64's outputs over positions, and each row's noise is the SplitMix64
stream that starts at its key (both pass BigCrush).

A step's tokens are then `keyed_sample(logits, temperature, keys, greedy)`. On CUDA that runs as one compiled
kernel per step: eagerly the noise is a dozen passes over a [rows, vocab] int64 tensor (2.5 GB of memory traffic
at 256 rows of a 152k vocabulary, ~1.5 ms a step); fused, the hash is computed in registers while the bf16
logits are read once (no float32 copy, no separate division or argmax pass).

Everything is vectorised int64 tensor arithmetic, on the CPU and on CUDA alike: multiplication wraps
modulo 2**64 on both (two's complement; tests/engine/test_keyed_noise.py pins the CPU against Python's
unbounded integers, and CUDA compiles int64 products to PTX mul.lo.s64, the low 64 bits), and logical right
shifts are arithmetic shifts with the sign-extended bits masked off. The constants above 2**63 are written as
the signed int64 with the same bits.
"""
from __future__ import annotations

import functools
import logging

import torch

logger = logging.getLogger(__name__)

_MASK64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15  # 2**64 / golden ratio, odd: SplitMix64's counter increment
_MULTIPLIER_1 = 0xBF58476D1CE4E5B9
_MULTIPLIER_2 = 0x94D049BB133111EB
SEED_SALT = 0x5EED5EED5EED5EED  # keeps seed 0's key away from the all-zero state
UNIFORM_BITS = 24  # a float32 holds every (k + 1) / 2**24 exactly
MIN_NOISE = 2.0 ** -25  # E for u = 1: half a grid step, as the midpoint rule would give


def as_int64(value: int) -> int:
    """The signed int64 with the low 64 bits of `value` (a seed may be any uint64)."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def _shifted_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 x: torch's >> is arithmetic, so the copied sign bits are masked off."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser (Stafford's Mix13) on int64, wrapping: a bijection of 64-bit words."""
    x = (x ^ _shifted_right(x, 30)) * as_int64(_MULTIPLIER_1)
    x = (x ^ _shifted_right(x, 27)) * as_int64(_MULTIPLIER_2)
    return x ^ _shifted_right(x, 31)


def row_keys(
    seeds: torch.Tensor,  # [num_rows] int64: each row's request seed (as_int64)
    positions: torch.Tensor,  # [num_rows] int64: the output position the row picks a token for
) -> torch.Tensor:  # [num_rows] int64
    """One key per (seed, position): position p of a seed is SplitMix64 output p + 1 of that seed's stream."""
    return mix(mix(seeds ^ as_int64(SEED_SALT)) + (positions + 1) * as_int64(GAMMA))


def exponential_noise(
    keys: torch.Tensor,  # [num_rows] int64 from row_keys
    vocab_size: int,
) -> torch.Tensor:  # [num_rows, vocab_size] float32, Exp(1) distributed
    """E(key, v) for every token v: the row's SplitMix64 stream, turned into Exp(1) noise."""
    return _exponential(keys.unsqueeze(1) + _offsets(vocab_size, keys.device))


def token_offsets(vocab_size: int, device: torch.device) -> torch.Tensor:  # [vocab_size] int64
    """(v + 1) * GAMMA for every token v: its counter step in a row's stream (wrapping)."""
    return torch.arange(1, vocab_size + 1, device=device, dtype=torch.int64) * as_int64(GAMMA)


def _exponential(x: torch.Tensor) -> torch.Tensor:
    """The Exp(1) noise of SplitMix64 states x (key + token offset), any shape; x is overwritten.

    Only the top 24 bits are kept, and those the finaliser's last xor-shift (x ^ x >>> 31) leaves unchanged,
    so it is skipped. In-place ops keep it to one int64 buffer and one float32 buffer.
    """
    for shift, multiplier in ((30, _MULTIPLIER_1), (27, _MULTIPLIER_2)):
        x.bitwise_xor_(_shifted_right(x, shift)).mul_(as_int64(multiplier))
    top = x.bitwise_right_shift_(64 - UNIFORM_BITS).bitwise_and_((1 << UNIFORM_BITS) - 1)
    uniform = top.to(torch.float32).add_(1.0).mul_(2.0 ** -UNIFORM_BITS)  # (0, 1]
    return uniform.log_().neg_().clamp_(min=MIN_NOISE)


_compiled_race = None  # torch.compile'd _race, built on first use on CUDA (False: compiling failed)


def keyed_sample(
    logits: torch.Tensor,  # [num_rows, vocab_size], any float dtype: -inf where a filter removed the token
    temperature: torch.Tensor,  # [num_rows] float32 > 0 (1.0 on greedy rows)
    keys: torch.Tensor,  # [num_rows] int64 from row_keys
    greedy: torch.Tensor,  # [num_rows] bool
) -> torch.Tensor:  # [num_rows] int64
    """Each row's token. A sampled row runs the exponential race in logs, argmax_v logits[v] / T - log E(key, v)
    (a draw from softmax(logits / T); -inf logits never win); a greedy row takes argmax_v logits[v] (no noise,
    T = 1: the same value exactly). On CUDA one fused kernel, compiled on first use (seconds: the verifier's
    warm-up samples once): it reads the logits once in their own dtype (bf16 from the model), upcasts, divides
    and races in registers, with the same integer noise (only logf may differ in its last bit, as
    exponential_noise's may from the CPU's). Every sampled row of every batch takes this one division, so a row's
    draw does not depend on what else the step samples."""
    global _compiled_race
    offsets = _offsets(logits.shape[-1], logits.device)
    if logits.is_cuda and _compiled_race is not False:
        try:
            if _compiled_race is None:
                _compiled_race = torch.compile(_race, dynamic=True, fullgraph=True)
            return _compiled_race(logits, temperature, keys, greedy, offsets)
        except Exception:  # noqa: BLE001 - an optimisation must not fail a step: the same draw, eagerly
            logger.exception("compiling the keyed sampler failed; it runs as plain kernels")
            _compiled_race = False
    return _race(logits, temperature, keys, greedy, offsets)


def _race(logits: torch.Tensor, temperature: torch.Tensor, keys: torch.Tensor, greedy: torch.Tensor,
          offsets: torch.Tensor) -> torch.Tensor:
    # The token offsets come in as a tensor: computed inside a compiled graph, (v + 1) * GAMMA becomes index
    # arithmetic, which inductor does not wrap modulo 2**64 (its CPU code gave zeros beyond the first lanes).
    log_noise = _exponential(keys.unsqueeze(1) + offsets).log_().masked_fill_(greedy.unsqueeze(1), 0.0)
    return (logits.float() / temperature.unsqueeze(1) - log_noise).argmax(dim=-1)


@functools.cache
def _offsets(vocab_size: int, device: torch.device) -> torch.Tensor:
    """token_offsets, made once per vocabulary and device (never written: _race adds the keys into a new tensor)."""
    return token_offsets(vocab_size, device)
