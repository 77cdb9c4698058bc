"""The keyed noise is SplitMix64 to the bit (so int64 wraps as it must), Exp(1) distributed, and independent
across tokens, output positions and seeds."""
import math

import numpy as np
import pytest
import torch
from scipy.stats import chisquare, kstest

from verifier_service.engine.keyed_noise import GAMMA, SEED_SALT, as_int64, exponential_noise, mix, row_keys

MASK = 2**64 - 1


def splitmix_mix(z: int) -> int:
    """SplitMix64's finaliser on Python's unbounded ints, reduced modulo 2**64: the reference."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def reference_uniform(seed: int, position: int, token: int) -> float:
    key = splitmix_mix((splitmix_mix((seed ^ SEED_SALT) & MASK) + (position + 1) * GAMMA) & MASK)
    bits = splitmix_mix((key + (token + 1) * GAMMA) & MASK)
    return ((bits >> 40) + 1) / 2**24


def noise(seeds, positions, vocab: int) -> torch.Tensor:
    return exponential_noise(row_keys(torch.tensor([as_int64(s) for s in seeds]), torch.tensor(positions)), vocab)


def test_mix_wraps_like_unsigned_64_bit_arithmetic():
    values = [0, 1, 2**63 - 1, 2**63, 2**64 - 1, 0x0123456789ABCDEF, GAMMA, 12345678901234567890]
    got = mix(torch.tensor([as_int64(v) for v in values])).tolist()
    assert [g & MASK for g in got] == [splitmix_mix(v) for v in values]


@pytest.mark.parametrize("seed, position", [(0, 0), (1, 7), (2**63 + 5, 100), (2**64 - 1, 4095)])
def test_noise_is_a_pure_function_of_seed_position_and_token(seed, position):
    vocab = 512
    expected = -torch.tensor([reference_uniform(seed, position, v) for v in range(vocab)], dtype=torch.float32).log()
    got = noise([seed], [position], vocab)[0]
    assert torch.equal(got, expected.clamp(min=2.0 ** -25))
    # another batch around it, another vocabulary cut: the same numbers
    assert torch.equal(noise([3, seed, 9], [0, position, 2], vocab + 7)[1, :vocab], got)


def test_noise_is_exponentially_distributed():
    draws = noise(range(64), range(64), 16_384).flatten().double().numpy()  # 2**20 draws
    assert kstest(draws, "expon").pvalue > 1e-4
    assert abs(draws.mean() - 1.0) < 5 / math.sqrt(len(draws))
    assert draws.min() > 0  # never 0: probs / noise is never 0 / 0
    uniform = np.exp(-draws)
    counts = np.histogram(uniform, bins=256, range=(0, 1))[0]
    assert chisquare(counts).pvalue > 1e-4


def pairs_look_independent(a: np.ndarray, b: np.ndarray) -> None:
    """Uniforms a and b (same length): uncorrelated, and their joint 16 x 16 histogram flat."""
    assert abs(np.corrcoef(a, b)[0, 1]) < 5 / math.sqrt(len(a))
    joint = np.histogram2d(a, b, bins=16, range=((0, 1), (0, 1)))[0].flatten()
    assert chisquare(joint).pvalue > 1e-4


@pytest.mark.parametrize("neighbour", ["token", "position", "seed"])
def test_neighbouring_keys_give_independent_noise(neighbour):
    """Counters next to each other (the weak spot of a bad hash) give unrelated numbers."""
    seeds, positions = list(range(256)), [3 * s for s in range(256)]
    base = noise(seeds, positions, 1024)
    if neighbour == "token":
        a, b = base[:, :-1], base[:, 1:]
    elif neighbour == "position":
        a, b = base, noise(seeds, [p + 1 for p in positions], 1024)
    else:
        a, b = base, noise([s + 1 for s in seeds], positions, 1024)
    pairs_look_independent(np.exp(-a.flatten().double().numpy()), np.exp(-b.flatten().double().numpy()))
