"""torch.compile is for CUDA only: on the CPU the runner keeps the eager layers (exact float32 path)."""
from verifier_service.engine.model_runner import ModelRunner
from verifier_service.model.layers import DecoderLayer


def test_the_cpu_runner_never_compiles(tmp_path):
    from engine_model.checkpoints import save_tiny_checkpoint

    save_tiny_checkpoint("qwen3-qk_norm-untied", tmp_path)
    runner = ModelRunner(tmp_path, device="cpu", dtype="float32", block_size=4, kv_cache_bytes=1 << 20,
                         compile_model=True)
    assert not runner.compiled
    for layer in runner.model.model.layers:
        assert layer.attention_inputs.__func__ is DecoderLayer.attention_inputs
        assert layer.attention_output.__func__ is DecoderLayer.attention_output
