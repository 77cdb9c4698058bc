"""nano-vllm's bench.py workload (the same prompts as bench/gpu_throughput.py's) under torch's profiler: the
device-time table of bench/kernel_table.py, to set beside specd's (`gpu_throughput.py --kernels`).
  PYTHONPATH=<nano-vllm and its wheels> python bench/nano_kernels.py MODEL_DIR"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_throughput import workload  # noqa: E402
from kernel_table import print_table, profiled  # noqa: E402
from nanovllm import LLM, SamplingParams  # noqa: E402

llm = LLM(sys.argv[1], enforce_eager=False, max_model_len=4096)
prompts, max_tokens = workload(256)
params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=n) for n in max_tokens]
llm.generate(["Benchmark: "], SamplingParams(), use_tqdm=False)
llm.generate(prompts, params, use_tqdm=False)  # the second run is timed: the first compiles the sampler's shapes
_, wall, kernels = profiled(llm.generate, prompts, params, False)
print(f"nano-vllm: {sum(max_tokens) / wall:.0f} tok/s under the profiler")
print_table("nano-vllm, nano-vllm's workload", wall, kernels)
