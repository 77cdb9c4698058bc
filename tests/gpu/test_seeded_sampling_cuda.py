"""Keyed sampling on CUDA: the hash wraps as on the CPU, and seeded sampled output with drafts, CUDA graphs and
steps launched ahead (their positions advanced on the device) is the output of decoding without drafts, except
where bf16 rounding of a differently shaped batch tips a near-tie of the exponential race."""
from __future__ import annotations

import pytest
import torch

from gpu.test_graphs_and_engine import BLOCK, MAX_TOKENS, PROMPTS, checkpoint, engine_for  # noqa: F401 - fixture
from support.engine_runs import run
from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest
from verifier_service.engine import keyed_noise
from verifier_service.engine.keyed_noise import exponential_noise, keyed_sample, row_keys, token_offsets

pytestmark = pytest.mark.gpu
NEAR_TIE = 0.05  # log-score gap of the race's top two that bf16 logits (|x| < 1 here) may tip


def test_keys_and_noise_on_cuda_equal_the_cpus():
    seeds = torch.randint(-2**63, 2**63 - 1, (64,), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(64) * 37
    keys = row_keys(seeds, positions)
    assert torch.equal(row_keys(seeds.cuda(), positions.cuda()).cpu(), keys)  # int64 wraps alike
    noise = exponential_noise(keys.cuda(), 49152).cpu()
    torch.testing.assert_close(noise, exponential_noise(keys, 49152), rtol=1e-6, atol=0)  # logf may differ by an ulp


@pytest.mark.parametrize("rows", [1, 2, 37, 256])
def test_the_fused_keyed_sampler_draws_the_plain_kernels_tokens(rows):
    """keyed_sample on CUDA is one compiled kernel reading the model's bf16 logits; it must pick what the eager
    noise, division and argmax pick: the race on sampled rows, the plain argmax on greedy ones."""
    generator = torch.Generator().manual_seed(rows)
    logits = (torch.randn(rows, 151936, generator=generator) * 4).bfloat16().cuda()
    temperature = (torch.rand(rows, generator=generator) + 0.3).cuda()
    greedy = (torch.arange(rows) % 3 == 1).cuda()
    temperature = torch.where(greedy, 1.0, temperature)  # as SamplingMetadata sets greedy rows
    keys = row_keys(torch.randint(-2**63, 2**63 - 1, (rows,), generator=generator), torch.arange(rows) * 11).cuda()
    fused = keyed_sample(logits, temperature, keys, greedy)
    assert keyed_noise._compiled_race not in (None, False), "the compiled sampler did not run"
    raced = (logits.float() / temperature.unsqueeze(1) - exponential_noise(keys, logits.shape[-1]).log()).argmax(-1)
    assert torch.equal(fused, torch.where(greedy, logits.float().argmax(dim=-1), raced))
    assert torch.equal(token_offsets(151936, logits.device), keyed_noise._offsets(151936, logits.device))  # unchanged


def race_gap(engine, params, seed: int, context: list[int], position: int) -> float:
    """The exponential race's top-1 minus top-2 log score (log p - log E) for the token after context."""
    from verifier_service.engine.sampling import target_scores

    table = list(range(-(-len(context) // BLOCK)))
    logits = engine.runner.execute(ScheduledBatch([ScheduledRequest("gap", context, 0, table, 0, 1)]))[-1:]
    scores = target_scores(logits.float(), torch.tensor([params.temperature], device="cuda"),
                           torch.tensor([params.top_k], device="cuda"),
                           torch.tensor([params.top_p], device="cuda"), torch.tensor([0.0], device="cuda"))
    noise = exponential_noise(row_keys(torch.tensor([seed], device="cuda"), torch.tensor([position], device="cuda")),
                              logits.shape[-1])
    top = (scores - noise.log()).topk(2).values[0]
    return float(top[0] - top[1])


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "chained"])
def test_seeded_sampling_with_drafts_and_graphs_equals_decoding_without(checkpoint, async_scheduling):
    from support.proposers import OracleProposer
    from specd.sampling import SamplingParams

    prompts = {f"s{i}": p for i, p in enumerate([PROMPTS[0], PROMPTS[1], PROMPTS[2][:50], PROMPTS[0]])}
    params = {rid: SamplingParams(max_tokens=MAX_TOKENS, temperature=0.7, top_p=0.95, seed=10 + i, ignore_eos=True)
              for i, rid in enumerate(prompts)}

    def generate(engine):
        for rid, prompt in prompts.items():
            engine.add_request(rid, prompt, params[rid])
        return run(engine)

    plain = generate(engine_for(checkpoint, None, async_scheduling=False))
    proposer = OracleProposer({rid: prompts[rid] + out for rid, out in plain.items()})
    engine = engine_for(checkpoint, proposer, async_scheduling=async_scheduling)
    speculative = generate(engine)
    stats = engine.take_step_stats()
    assert (sum(s.scheduled_ahead for s in stats) > 0) is async_scheduling
    assert sum(s.spec_decoding.num_accepted_tokens for s in stats if s.spec_decoding) > MAX_TOKENS
    differing = 0
    for rid, expected in plain.items():
        if speculative[rid] != expected:
            differing += 1
            first = next(i for i, (a, b) in enumerate(zip(speculative[rid], expected)) if a != b)
            gap = race_gap(engine, params[rid], params[rid].seed, prompts[rid] + expected[:first], first)
            print(f"{rid}: first difference at token {first}, race gap {gap:.4f}")
            assert gap < NEAR_TIE, f"{rid} differs at token {first} with a race gap of {gap:.3f}: not a near-tie"
    print(f"{differing} of {len(plain)} sampled outputs differ (near-ties)")
