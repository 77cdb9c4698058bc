"""The model on CUDA: flash-attn equals the reference backend, graph replay equals eager (and touches no
other sequence's KV), greedy with speculation equals without, and a step syncs with the host once."""
from __future__ import annotations


import pytest
import torch

from support.engine_runs import assert_equal_or_near_tie, generate_greedy, host_syncs_per_step, run
from verifier_service.attention.reference import ReferenceAttentionBackend
from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest

pytestmark = pytest.mark.gpu
BLOCK = 256
MAX_TOKENS = 40  # greedy generations of the engine tests


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A random Llama with GQA and head_dim 64 (flash-attn's slim build carries 64 and 128)."""
    pytest.importorskip("flash_attn")
    from engine_model.checkpoints import save_tiny_checkpoint

    folder = tmp_path_factory.mktemp("gpu-llama")
    save_tiny_checkpoint("llama-gqa-llama3-rope-untied-sharded", folder, head_dim=64, max_position_embeddings=2048,
                         num_hidden_layers=3, vocab_size=512)
    return folder


def make_runner(checkpoint, graphs: bool, widths=(1, 5)):
    from verifier_service.engine.model_runner import ModelRunner

    runner = ModelRunner(checkpoint, device="cuda", dtype="bfloat16", block_size=BLOCK, kv_cache_bytes=64 << 20)
    if graphs:
        assert runner.capture_cuda_graphs(8, list(widths))
    return runner


PROMPTS = [list(range(3, 40)), [7, 8, 9] * 90, list(range(100, 400))]
TABLES = [[0, 1], [5, 2], [4, 6]]  # scratch is the last block, owned by nobody


def prefill(runner):
    runner.execute(ScheduledBatch([ScheduledRequest(f"r{i}", p, 0, t, 0, 1) for i, (p, t) in
                                   enumerate(zip(PROMPTS, TABLES))]))


def verify_step(draft_counts):
    """Each sequence feeds one token plus draft_counts[i] drafts after its prompt."""
    return ScheduledBatch([ScheduledRequest(f"r{i}", [11 + j for j in range(1 + d)], len(p), t, d, 1 + d)
                           for i, (p, t, d) in enumerate(zip(PROMPTS, TABLES, draft_counts))])


def test_flash_model_equals_reference_backend_in_bf16(checkpoint):
    runner = make_runner(checkpoint, graphs=False)
    assert runner.backend.name == "flash-attn"
    results = []
    for backend in (runner.backend, ReferenceAttentionBackend()):
        runner.model.bind_kv_cache(runner.kv_cache.k_caches, runner.kv_cache.v_caches, backend)
        prefill(runner)
        results.append(runner.execute(verify_step([4, 0, 2])))
    relative = (results[0].float() - results[1].float()).norm() / results[1].float().norm()
    assert relative < 2e-2, f"relative error {relative:.2e}"


@pytest.mark.parametrize("draft_counts", [[0, 0, 0], [4, 4, 4], [4, 0, 2], [1, 3, 0]])
def test_graph_replay_equals_eager_and_writes_no_foreign_kv(checkpoint, draft_counts):
    eager, graphed = make_runner(checkpoint, graphs=False), make_runner(checkpoint, graphs=True)
    scratch = graphed.num_blocks
    results = []
    for runner in (eager, graphed):
        prefill(runner)
        batch = verify_step(draft_counts)
        if runner is graphed:
            assert runner.graphs.shape_for(batch) is not None  # padded to a captured shape, not eager
        results.append(runner.execute(batch))
    assert results[1].shape == (sum(draft_counts) + 3, eager.vocab_size)
    torch.testing.assert_close(results[1], results[0], atol=3e-2, rtol=3e-2)
    # Every block but the scratch block holds what the eager run wrote there (padding went to scratch).
    for cache_eager, cache_graphed in zip(eager.kv_cache.k_caches, graphed.kv_cache.k_caches):
        torch.testing.assert_close(cache_graphed[:scratch].float(), cache_eager[:scratch].float(), atol=3e-2, rtol=0)


@pytest.mark.parametrize("advances, draft_counts", [([0, 0, 0], [0, 0, 0]), ([2, 0, 4], [4, 0, 2]),
                                                     ([4, 1, 3], [8, 8, 1])])
def test_a_graph_step_continuing_from_a_step_in_flight_equals_eager_on_the_real_inputs(checkpoint, advances,
                                                                                        draft_counts):
    """The step in flight fed 1 + 4 tokens per sequence and accepted `advances` of them; the next step, packed
    before that was known, takes its first token and its start from the result on the device (positions,
    slots and context lengths computed inside the graph) and judges its drafts inside the graph."""
    from support.resolved_steps import resolve_on_host
    from verifier_service.engine.rejection_sampler import verify
    from verifier_service.engine.request import Request
    from verifier_service.engine.sampling_metadata import SamplingMetadata
    from specd.sampling import SamplingParams

    eager, graphed = make_runner(checkpoint, graphs=False), make_runner(checkpoint, graphs=True, widths=(1, 5, 9))
    for runner in (eager, graphed):
        prefill(runner)
        runner.execute(verify_step([4, 4, 4]))  # the step "in flight": 5 tokens at each prompt's end
    previous = torch.tensor([[40 + i, a] for i, a in enumerate(advances)], device="cuda")
    chained = ScheduledBatch([ScheduledRequest(f"r{i}", [0] + [60 + j for j in range(d)], len(p) + 1, t, d, 1 + d,
                                               previous_token_row=i, previous_num_drafts=4)
                              for i, (p, t, d) in enumerate(zip(PROMPTS, TABLES, draft_counts))],
                             previous_result=previous)
    resolved = resolve_on_host(chained)
    assert [r.start_position for r in resolved.requests] == [len(p) + 1 + a for p, a in zip(PROMPTS, advances)]
    expected = eager.execute(resolved).float()
    shape = graphed.graphs.shape_for(chained)
    outputs, rows = graphed.graphs.run(chained, shape)
    logits = (outputs.logits if rows is None else outputs.logits[rows]).float()
    torch.testing.assert_close(logits, expected, atol=3e-2, rtol=3e-2)
    requests = [Request(r.request_id, [0], SamplingParams(max_tokens=50), i) for i, r in enumerate(resolved.requests)]
    verdict = verify(logits, SamplingMetadata.build(resolved, requests, "cuda"))  # the sampler on the same logits
    assert outputs.rows[:3, -1].tolist() == verdict.num_accepted
    assert [row[:a + 1] for row, a in zip(outputs.rows[:3].tolist(), verdict.num_accepted)] == verdict.token_ids
    assert outputs.continuation[:3].tolist() == [[t[-1], a] for t, a in zip(verdict.token_ids, verdict.num_accepted)]


def test_prefill_and_oversize_batches_run_eagerly(checkpoint):
    runner = make_runner(checkpoint, graphs=True)
    prompt = ScheduledBatch([ScheduledRequest("a", PROMPTS[0], 0, TABLES[0], 0, 1)])
    assert runner.graphs.shape_for(prompt) is None
    too_wide = ScheduledBatch([ScheduledRequest("a", list(range(7)), 40, TABLES[0], 6, 7)])
    assert runner.graphs.shape_for(too_wide) is None
    too_many = ScheduledBatch([ScheduledRequest(f"r{i}", [1], 40, [i], 0, 1) for i in range(9)])
    assert runner.graphs.shape_for(too_many) is None


def engine_for(checkpoint, proposer, enforce_eager=False, async_scheduling=None, max_speculative_tokens=None):
    from verifier_service.engine.config import EngineConfig
    from verifier_service.engine.engine import Engine

    config = EngineConfig(model=str(checkpoint), device="cuda", dtype="bfloat16", block_size=BLOCK,
                          kv_cache_bytes=64 << 20, max_num_seqs=8, num_speculative_tokens=4,
                          max_speculative_tokens=max_speculative_tokens, enforce_eager=enforce_eager,
                          enable_prefix_caching=False, async_scheduling=async_scheduling)
    return Engine(config, proposer)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "chained"])
def test_greedy_with_speculation_equals_without(checkpoint, async_scheduling):
    from support.proposers import OracleProposer

    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[2][:50]]
    plain = generate_greedy(engine_for(checkpoint, None, async_scheduling=False), prompts, MAX_TOKENS)
    references = {rid: prompts[int(rid[1:])] + out for rid, out in plain.items()}
    proposer = OracleProposer(references)
    engine = engine_for(checkpoint, proposer, async_scheduling=async_scheduling)
    assert engine.runner.graphs is not None
    speculative = generate_greedy(engine, prompts, MAX_TOKENS)
    assert proposer.num_proposed > 0
    stats = engine.take_step_stats()
    assert (sum(s.scheduled_ahead for s in stats) > 0) is async_scheduling
    assert sum(s.spec_decoding.num_accepted_tokens for s in stats if s.spec_decoding) > MAX_TOKENS
    assert_equal_or_near_tie(engine, {f"r{i}": p for i, p in enumerate(prompts)}, speculative, plain, BLOCK)


def test_every_k_up_to_the_maximum_and_mixed_k_batches_replay_graphs(checkpoint):
    """Requests asking for k = 0 .. 8 (and 20, clamped) in one batch: every decode / verify step replays a
    captured graph (none runs eagerly), widths beyond the default k + 1 included, and greedy output equals
    plain decoding's."""
    from support.proposers import OracleProposer
    from specd.sampling import SamplingParams

    asks = [0, 1, 2, 3, 4, 6, 8, 20]
    prompts = {f"k{k}": [PROMPTS[0], PROMPTS[1], PROMPTS[2][:50]][i % 3] for i, k in enumerate(asks)}
    plain_by_prompt = generate_greedy(engine_for(checkpoint, None, async_scheduling=False),
                                      [PROMPTS[0], PROMPTS[1], PROMPTS[2][:50]], MAX_TOKENS)
    plain = {rid: plain_by_prompt[f"r{i % 3}"] for i, rid in enumerate(prompts)}
    engine = engine_for(checkpoint, OracleProposer({rid: prompts[rid] + plain[rid] for rid in prompts}),
                        max_speculative_tokens=8)
    assert engine.runner.graphs.widths == [1, 2, 3, 5, 9]
    shape_for, shapes, eager = engine.runner.graphs.shape_for, [], []

    def recording(batch):
        shape = shape_for(batch)
        if all(r.start_position > 0 and r.num_logits == r.num_tokens for r in batch.requests):
            (shapes if shape is not None else eager).append(shape)
        return shape

    engine.runner.graphs.shape_for = recording
    for (rid, prompt), k in zip(prompts.items(), asks):
        engine.add_request(rid, prompt, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True,
                                                       num_speculative_tokens=k))
    outputs = run(engine)
    assert not eager, f"{len(eager)} decode / verify steps ran eagerly"
    assert {width for _, width in shapes} >= {9}  # the k = 8 requests' steps
    assert_equal_or_near_tie(engine, prompts, outputs, plain, BLOCK)


@pytest.mark.parametrize("temperature, filters, drafting", [(0.0, True, True), (0.6, True, True), (0.6, False, False)],
                         ids=["greedy", "sampled-top-k-top-p", "sampled-plain-no-drafts"])
def test_a_decode_step_syncs_with_the_host_at_most_once(checkpoint, temperature, filters, drafting):
    from support.proposers import BruteForceNgramProposer
    from specd.sampling import SamplingParams

    engine = engine_for(checkpoint, BruteForceNgramProposer() if drafting else None)
    for i, prompt in enumerate([PROMPTS[1], PROMPTS[0]]):
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=30, ignore_eos=True, temperature=temperature,
                                                           top_p=0.9 if filters else 1.0, top_k=50 if filters else 0))
    engine.step()  # the prefill
    counts = host_syncs_per_step(engine)
    print("host syncs per step:", counts)
    assert counts and max(counts) <= 1, counts


def test_async_scheduling_gives_the_synchronous_output_token_for_token(checkpoint):
    """Same forwards in the same order, the next step's first tokens taken from the device: identical output
    (greedy and seeded sampling), with requests ending at different steps by length and by a stop token."""
    from specd.sampling import SamplingParams

    def outputs(async_scheduling: bool) -> dict[str, list[int]]:
        engine = engine_for(checkpoint, None, async_scheduling=async_scheduling)
        assert engine.async_scheduling is async_scheduling and engine.runner.graphs is not None
        requests = {
            "greedy": SamplingParams(max_tokens=40, ignore_eos=True),
            "short": SamplingParams(max_tokens=7, ignore_eos=True),
            "seeded": SamplingParams(max_tokens=33, temperature=0.8, top_p=0.9, seed=3, ignore_eos=True),
            "stops": SamplingParams(max_tokens=40, stop_token_ids=(stop,)),
        }
        for (rid, params), prompt in zip(requests.items(), [PROMPTS[0], PROMPTS[1], PROMPTS[2][:50], PROMPTS[0]]):
            engine.add_request(rid, prompt, params)
        result = run(engine)
        assert engine.block_manager.num_used_blocks == 0
        scheduled_ahead = sum(step.scheduled_ahead for step in engine.take_step_stats())
        assert (scheduled_ahead > 0) is async_scheduling  # else the comparison below would prove nothing
        return result

    stop = generate_greedy(engine_for(checkpoint, None, async_scheduling=False), [PROMPTS[0]], MAX_TOKENS)["r0"][12]
    synchronous, overlapped = outputs(False), outputs(True)
    assert overlapped == synchronous
    assert len(synchronous["stops"]) <= 13 and synchronous["stops"][-1] == stop



def test_penalties_and_bias_overlapped_give_the_synchronous_output_with_one_sync_per_step(checkpoint):
    """Requests with penalties or a logit bias take the eager verdict (not the graph's greedy one) on logits
    from graph replays; under async scheduling the token in flight is counted on the device: the output is the
    synchronous one token for token, and a step still syncs with the host at most once."""
    from specd.sampling import SamplingParams

    requests = {  # request id -> (prompt, params); "plain" shares "penalized"'s prompt
        "penalized": (PROMPTS[0], SamplingParams(max_tokens=40, ignore_eos=True, repetition_penalty=1.3,
                                                 frequency_penalty=0.5, presence_penalty=0.3)),
        "biased": (PROMPTS[1], SamplingParams(max_tokens=40, ignore_eos=True, logit_bias={5: 3.0, 7: -100.0})),
        "seeded": (PROMPTS[2][:50], SamplingParams(max_tokens=33, temperature=0.8, seed=3, ignore_eos=True,
                                                   frequency_penalty=1.0)),
        "plain": (PROMPTS[0], SamplingParams(max_tokens=40, ignore_eos=True)),
    }

    def started(async_scheduling: bool):
        engine = engine_for(checkpoint, None, async_scheduling=async_scheduling)
        assert engine.runner.graphs is not None
        for rid, (prompt, params) in requests.items():
            engine.add_request(rid, prompt, params)
        return engine

    def outputs(async_scheduling: bool) -> dict[str, list[int]]:
        engine = started(async_scheduling)
        result = run(engine)
        assert (sum(step.scheduled_ahead for step in engine.take_step_stats()) > 0) is async_scheduling
        return result

    synchronous = outputs(False)
    assert outputs(True) == synchronous
    assert synchronous["penalized"] != synchronous["plain"]  # else the penalties did nothing here
    engine = started(True)
    engine.step()  # the prefill
    counts = host_syncs_per_step(engine)
    print("host syncs per step:", counts)
    assert counts and max(counts) <= 1, counts
