"""Tensor parallelism on CUDA (NCCL, compiled regions with the all-reduce inside, CUDA graphs): 2 and 4 ranks give
one GPU's logits in bf16, eager and replayed, and closing them (graphs with NCCL inside captured) stops every rank
and leaves the process groups; rank 0 syncs with its device at most once per decode step; the default model's
greedy output with speculation equals its output without on 2 ranks (or differs first at a near-tie, as on one
GPU: tests/gpu/test_default_model.py)."""
from __future__ import annotations


import pytest
import torch
import torch.distributed as dist

from support.engine_runs import generate_greedy, host_syncs_per_step, top2_gap
from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest
from verifier_service.engine.config import EngineConfig
from verifier_service.engine.engine import Engine
from verifier_service.runners import build_model_runner

pytestmark = pytest.mark.gpu
BLOCK = 256
PROMPTS = [list(range(3, 40)), [7, 8, 9] * 90, list(range(100, 400))]
TABLES = [[0, 1], [5, 2], [4, 6]]


def needs_gpus(count: int) -> None:
    if torch.cuda.device_count() < count:
        pytest.skip(f"needs {count} GPUs, {torch.cuda.device_count()} visible")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A random Llama with GQA (4 query heads, 2 KV heads: at 4 ranks each KV head is on two) and head_dim 64."""
    pytest.importorskip("flash_attn")
    from engine_model.checkpoints import save_tiny_checkpoint

    folder = tmp_path_factory.mktemp("gpu-tp-llama")
    save_tiny_checkpoint("llama-gqa-llama3-rope-untied-sharded", folder, head_dim=64, max_position_embeddings=2048,
                         num_hidden_layers=3, vocab_size=512)
    return folder


def config_for(model, tensor_parallel_size: int, **changes) -> EngineConfig:
    settings = dict(model=str(model), device="cuda", dtype="bfloat16", block_size=BLOCK, kv_cache_bytes=64 << 20,
                    max_num_seqs=8, num_speculative_tokens=4, max_speculative_tokens=4, enable_prefix_caching=False,
                    tensor_parallel_size=tensor_parallel_size)
    return EngineConfig(**{**settings, **changes})


def steps() -> list[ScheduledBatch]:
    """A prefill (eager), a verify step of mixed widths, then a decode step (graph replays)."""
    drafts = [4, 0, 2]
    return [
        ScheduledBatch([ScheduledRequest(f"r{i}", p, 0, t, 0, 1) for i, (p, t) in enumerate(zip(PROMPTS, TABLES))]),
        ScheduledBatch([ScheduledRequest(f"r{i}", [11 + j for j in range(1 + d)], len(p), t, d, 1 + d)
                        for i, (p, t, d) in enumerate(zip(PROMPTS, TABLES, drafts))]),
        ScheduledBatch([ScheduledRequest(f"r{i}", [20], len(p) + 1 + d, t, 0, 1)
                        for i, (p, t, d) in enumerate(zip(PROMPTS, TABLES, drafts))]),
    ]


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    got, expected = got.float(), expected.float()  # logits come in the model's dtype (bf16)
    return float((got - expected).norm() / expected.norm())


@pytest.mark.parametrize("tensor_parallel_size, all_reduce", [(2, "nccl"), (4, "nccl"), (2, "one-shot"),
                                                             (4, "one-shot")])
def test_sharded_logits_equal_one_gpu_in_bf16_eager_and_replayed(checkpoint, tensor_parallel_size, all_reduce,
                                                                  monkeypatch):
    from verifier_service.sharding import collectives
    from verifier_service.sharding.one_shot_all_reduce import bound_to_another_group

    needs_gpus(tensor_parallel_size)
    monkeypatch.setenv("SPECD_TENSOR_PARALLEL_ALL_REDUCE", all_reduce)  # the spawned ranks inherit it
    single = build_model_runner(config_for(checkpoint, 1))
    expected = [single.execute(batch) for batch in steps()]
    sharded = build_model_runner(config_for(checkpoint, tensor_parallel_size))
    try:
        if all_reduce == "one-shot" and bound_to_another_group(dist.group.WORLD):
            pytest.skip("this process bound symmetric memory to an earlier process group (torch binds it once per "
                        "process; every rank kept NCCL): run this case in a process of its own, as device_run.sh does")
        assert collectives.all_reduce_in_use() == all_reduce  # rank 0 (this process) set it up as asked
        if all_reduce == "one-shot":  # and a step's [tokens, hidden] activations take it, fused with the norms
            step_rows = torch.empty(5, sharded.config.hidden_size, dtype=torch.bfloat16, device="cuda")
            assert collectives._one_shot.fits(step_rows) and collectives.fuses_add_rms_norm(step_rows)
        assert sharded.graphs is not None and all(sharded.graphs.shape_for(b) for b in steps()[1:])
        got = [sharded.execute(batch) for batch in steps()]
        eager = build_eager_logits(sharded)
    finally:
        sharded.close()
    assert_left_cleanly(sharded)
    for step_got, step_expected in zip(got, expected):
        assert step_got.shape == step_expected.shape
        assert relative_error(step_got, step_expected) < 2e-2
    assert relative_error(got[1], eager) < 2e-2  # the captured graph (collectives inside) equals the eager forward


def assert_left_cleanly(sharded) -> None:
    """After close: every other rank exited 0 and this process left the process groups (NCCL's teardown waits for
    every CUDA graph that captured one of its collectives: verifier_service/parallel/teardown.py)."""
    assert [worker.exitcode for worker in sharded.supervisor.workers] == [0] * len(sharded.supervisor.workers)
    assert not dist.is_initialized(), "the process groups were not left: see the teardown error in the log"


def build_eager_logits(sharded) -> torch.Tensor:
    """The first verify step again, forced eager on every rank (a batch no graph fits: one more sequence)."""
    verify = steps()[1]
    extra = ScheduledRequest("x", [1] * 3, 0, [7], 0, 3)  # a prompt chunk in the batch: the eager path
    logits = sharded.execute(ScheduledBatch(verify.requests + [extra]))
    return logits[:verify.num_logits]


@pytest.mark.parametrize("temperature", [0.0, 0.6], ids=["greedy-verdict-in-graph", "sampled"])
def test_a_decode_step_syncs_rank_0_with_its_device_at_most_once(checkpoint, temperature):
    needs_gpus(2)
    from support.proposers import BruteForceNgramProposer
    from specd.sampling import SamplingParams

    engine = Engine(config_for(checkpoint, 2), BruteForceNgramProposer())
    try:
        for i, prompt in enumerate(PROMPTS[:2]):
            engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=30, ignore_eos=True, temperature=temperature))
        engine.step()  # the prefill
        counts = host_syncs_per_step(engine)
    finally:
        engine.runner.close()
    print("rank 0's host syncs per step:", counts)
    assert counts and max(counts) <= 1, counts


def test_default_model_greedy_with_speculation_equals_without_on_two_ranks():
    needs_gpus(2)
    pytest.importorskip("flash_attn")
    from transformers import AutoTokenizer

    from drafter_service.config import DrafterConfig
    from drafter_service.local import LocalProposer
    from specd.default_model import resolve_model_path

    try:
        model = resolve_model_path("default")
    except RuntimeError as error:
        pytest.skip(str(error))
    from bench.workload import prompts as workload_prompts

    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = [tokenizer(text)["input_ids"] for text in workload_prompts(8)[1]]
    config = config_for(model, 2, kv_cache_bytes=256 << 20)
    runner = build_model_runner(config)  # one set of ranks for both engines
    try:
        plain = generate_greedy(Engine(config, None, runner), prompts, 96)
        engine = Engine(config, LocalProposer(DrafterConfig(min_ngram=1, max_ngram=4)), runner)
        speculative = generate_greedy(engine, prompts, 96)
        gaps = {rid: first_difference_gap(runner, prompts[int(rid[1:])], plain[rid], speculative[rid])
                for rid in plain if speculative[rid] != plain[rid]}
    finally:
        runner.close()
    print(f"default model, bf16, 2 ranks: {len(prompts) - len(gaps)}/{len(prompts)} identical; near-ties {gaps}")
    assert all(gap <= 0.5 for gap in gaps.values()), gaps


def first_difference_gap(runner, prompt: list[int], expected: list[int], got: list[int]) -> float:
    first = next(i for i, (a, b) in enumerate(zip(got, expected)) if a != b)
    return top2_gap(runner, prompt + expected[:first], BLOCK)
