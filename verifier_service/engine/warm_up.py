"""The engine's warm-up: what the verifier runs before it reports SERVING, and what GPU benches run before
they time anything, so both pay for lazy set-up in the same place (then start_up_objects.freeze())."""
from __future__ import annotations

from specd.sampling import SamplingParams
from verifier_service.engine.engine import Engine


def warm_up(engine: Engine) -> None:
    """A prefill and a few decode steps, greedy, then sampled alone and beside a greedy request (on CUDA the
    keyed sampler compiles once for one row and once for several), then a prompt longer than a KV block (and than
    the few-row GEMMs' limit, model/compile.py TRITON_ROWS_MAX, where a dynamic graph compiles apart) twice,
    the second time from the prefix cache (a prefill after cached blocks: on an H200 the first one outside the
    warm-up stalled a request 2.55 s), so the first real request does not pay for lazy set-up. Leaves no request
    behind and no step stats."""
    prompt, greedy = [1, 2, 3, 4, 1, 2, 3], SamplingParams(max_tokens=4, ignore_eos=True)
    sampled = SamplingParams(max_tokens=2, temperature=1.0, seed=0, ignore_eos=True)
    block_size = engine.block_manager.block_size
    long_prompt = [5 + i % 97 for i in range(block_size + 101)]
    phases = [{"warmup": (prompt, greedy)}, {"warmup-sampled": (prompt, sampled)},
              {"warmup": (prompt, greedy), "warmup-sampled": (prompt, sampled)}]
    if len(long_prompt) + 4 < engine.max_model_len:
        phases += [{"warmup-long": (long_prompt, greedy)}, {"warmup-cached": (long_prompt, greedy)}]
    for requests in phases:
        for request_id, (request_prompt, params) in requests.items():
            engine.add_request(request_id, request_prompt, params)
        while engine.has_unfinished_requests():
            engine.step()
    engine.take_step_stats()  # the warm-up does not count in the metrics
