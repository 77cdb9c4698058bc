"""The benchmarks users run, each a module: `python -m bench.<name> --help`.

engine, drafter, serve and stack measure specd on the CPU or a GPU (the Makefile's bench-* targets run the first
three); gpu_latency, gpu_throughput and profile_step measure and profile the engine on a GPU; soak and acceptance
check behaviour under load and drafting on recorded outputs. The rest are their workloads and harness. Results
and how to reproduce them: docs/BENCHMARKS.md.
"""
