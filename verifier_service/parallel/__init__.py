"""Tensor parallelism of the verifier's model over the GPUs of one host (`--tensor-parallel-size N`).

Rank 0 is the verifier process (scheduler, drafter client, gRPC server); it spawns ranks 1..N-1, each a
process holding 1/N of the model (Megatron-style, see shard.py) on its own GPU. Per step:

    rank 0: engine.step -> ParallelRunner.execute(batch) -> StepChannel.publish(encode(batch)) -> forward
    rank r: StepChannel.receive() -> decode -> ModelRunner.execute(batch) -> forward (the same one)

and inside the forward every rank meets the others in the same collectives (an all-reduce after the
embedding, o_proj and down_proj, an all-gather of the LM head's vocabulary slices). Only rank 0 samples.

Files: shard.py (who holds what), layers.py + model.py (the sharded modules), collectives.py (the
all-reduce the compiled regions can hold, fused with the residual add + norm where it can be, the logits gather),
one_shot_all_reduce.py + triton_one_shot.py (the low-latency all-reduce over symmetric memory for decode steps'
small tensors, the default on CUDA), batch_codec.py + step_channel.py (one
step's inputs to the other ranks), launch.py + worker.py (process start-up), shared_tuning.py (every rank
tunes torch.compile's kernels to the same choices), runner.py (rank 0's
runner), supervisor.py (a rank that dies or hangs takes the verifier out), teardown.py (every rank drops its
CUDA graphs, then all leave the process groups together), diagnostics.py (per-rank phase logs and stack dumps,
so a stuck run says where each rank waits).
"""
