"""Which model runner a verifier's engine gets: one rank's (engine/rank_runner.py), or with tensor parallelism rank 0's
ParallelRunner, which starts the other ranks (parallel/launch.py). It sits above both engine/ and parallel/, whose
rank processes build their own runners from engine/."""
from __future__ import annotations

from verifier_service.engine.config import EngineConfig


def build_model_runner(config: EngineConfig, drafts: bool = True, on_rank_failure=None):
    """The real model runner for config (imported on use, so engine logic loads without a model); with drafts,
    CUDA graphs for every verify width up to the most drafts a request may get.

    With tensor_parallel_size > 1 this is rank 0's ParallelRunner, which starts the other ranks
    (parallel/launch.py; on_rank_failure(reason) runs when one dies or hangs).
    """
    if config.tensor_parallel_size > 1:
        from verifier_service.parallel.launch import start_tensor_parallel

        return start_tensor_parallel(config, drafts, on_rank_failure)
    from verifier_service.engine.rank_runner import build_rank_runner

    return build_rank_runner(config, drafts)
