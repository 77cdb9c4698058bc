#!/usr/bin/env bash
# Sets up the GPU machine (wheels from .device/, random checkpoints) and runs what is asked, in one call:
#   bash bench/device_run.sh [tests] [latency] [latency8b] [throughput] [async] [enginestep] [enginestep8b] [eager] [profile] [trace] [latency1] [before] [enginestep_before] [nanovllm] [nanovllm_before] [kernels] [sampler]
#                            [tpsmoke] [tptests] [tplatency] [tplatency1] [tplatency2] [tplatency4] [tplatency2nccl]
#                            [tplatency4nccl] [allreduce] [oneshottest] [tplatency70b] [tpthroughput] [tpkernels1] [tpkernels2]
#                            [tplatency1_before] [tplatency2_before] [allreduce_before] [tptimeline1] [tptimeline2]
#                            [tplatency1untuned] [tplatency2untuned] [graphtimingtest] [tpdefaultmodel] [verifytest]
#                            [verifytest_before] [tplogits2] [pdltest]
# trace: ordered kernels of one decode and one verify step; latency1: batch-1 latency, compiled only;
# before: latency1 of the code in .device/old (e.g. `git archive HEAD | tar -x -C .device/old` before a change),
# to compare before / after on the same machine in one call; enginestep_before: the engine-step bench of
# .device/old; nanovllm: specd's throughput (speculation off / on, async) alternating with nano-vllm's own
# bench.py on the same workload and card (peers in .device/peers; specd's configurations in one process, their
# order reversed every other round, every step's stats in $OUT/steps.jsonl); nanovllm_before: the same with the code in
# .device/old as a third column; kernels: specd's and nano-vllm's device time on that workload by kernel family
# (after nanovllm, which installs nano-vllm's wheels); sampler: a sampled step's sampler alone, before / now
# (bench/gpu_sampler.py).
# Tensor parallelism (issue 15; a machine of 2 or 4 GPUs; each part has its own time limit, see tp_run):
# tpsmoke = the cheapest check, a small random Llama at TP 2 three times (eager; CUDA graphs without compile;
# compiled + graphs as the verifier runs), each phase timed (bench/gpu_tp.py smoke), ~2-3 min in all;
# tptests = the TP GPU tests (~5 min: five model builds, four compiled anew; with the one-shot all-reduce's own,
# which oneshottest runs alone, ~1 min; the one-shot logits cases first, each in a process of its own, since torch
# binds a process's symmetric memory to its first process group); tplatency1 / tplatency2 /
# tplatency4 = batch-1 steps of Qwen3-8B shapes at TP 1 / 2 / 4 (~2-3 min each; tplatency = all three), rows
# collected in one table across parts, with the default one-shot all-reduce over symmetric memory; tplatency1_before /
# tplatency2_before = the same for the code in .device/old (rows in their own table); tplatency2nccl /
# tplatency4nccl = the same with NCCL's (SPECD_TENSOR_PARALLEL_ALL_REDUCE=nccl); allreduce = the one shot
# all-reduce against NCCL's alone, 8 KB to 2 MB at 2 and 4 ranks in CUDA graphs (bench/gpu_allreduce.py, ~1 min);
# tplatency70b = Llama-3-70B shapes at TP 4 with speculation on / off (weights drawn on each GPU, no checkpoint);
# tpthroughput = nano-vllm's workload at TP 2 on a Qwen3-8B-shaped checkpoint, nano-vllm's own tp2 run first in
# the same call (.device/peers, a copy of /work/shared/device/peers). NCCL's NVLink multicast stays off as the
# machine sets it (NCCL_NVLS_ENABLE=0). tpkernels1 / tpkernels2 = rank 0's batch-1 decode step of Qwen3-8B shapes at
# TP 1 / 2 by kernel (bench/gpu_tp.py latency --kernels), to see what TP 2 adds beyond its all-reduces.
# tplatency1untuned / tplatency2untuned = tplatency1 / 2 compiled without run-time tuning (Inductor's heuristics
# choose every kernel's configuration, the same on every rank; SPECD_BENCH_UNTUNED=1 does it for any gpu_tp.py part).
# allreduce_before = allreduce of the code in .device/old. graphtimingtest = tests/gpu/test_graph_timing.py alone.
# verifytest / verifytest_before = the attention and engine GPU tests of this tree / of the code in .device/old.
# tplogits2 = the TP tests' one-shot logits case at 2 ranks alone (part of tptests). pdltest = tests/gpu/test_pdl.py.
# tpdefaultmodel = the default model's GPU tests, TP 1 and 2. Its 98 MB GGUF exceeds one call's carry, so it comes in
# two pieces over two calls made back to back: G=~/.cache/specd/gguf/*.gguf (fetched by python -m specd.default_model);
# head -c 50331648 $G >.device/gguf.part1; tail -c +50331649 $G >.device-part2/gguf.part2; the first call carries
# .device and copies the piece to /tmp/gguf.part1, the second carries .device-part2 and runs this part.
# tptimeline1 / tptimeline2 = every rank's host and device
# timeline of batch-1 decode steps at TP 1 / 2 (chrome traces in $OUT/timeline/tpN, summed by bench/tp_timeline.py).
# Results and logs go to $OUT (or /tmp/out); each part prints a short table at the end. bench/device_call.sh runs
# lanes of parts side by side on different GPUs within a time limit and packs $OUT into one archive.
set -u
OUT=${OUT:-/tmp/out}
# Installed once per machine, so that several parts may run side by side (on different GPUs) in one call.
[ -f /tmp/site/.specd-installed ] || { python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/*.whl &&
  touch /tmp/site/.specd-installed; } || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
bash bench/build_native_store.sh . .device/old  # the drafter's native store, here and in the code measured against
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader | tee "$OUT/card.txt"
models() { for p in "$@"; do [ -d "/tmp/models/$p" ] || python3 bench/make_random_model.py "$p" "/tmp/models/$p" >/dev/null; done; }
# tp_run LIMIT NAME CMD...: one tensor-parallel command, in its own process group, output in $OUT/NAME.log (its
# tail printed). It runs with NCCL's warnings on, every rank logging its start-up phases and first steps, and
# writing its Python stacks when one of those takes over 60 s (SPECD_TENSOR_PARALLEL_DUMP_S) or rank 0 declares
# a step hung after 120 s (SPECD_TENSOR_PARALLEL_TIMEOUT_S). Past LIMIT seconds every rank writes its stacks
# (SIGUSR1 to ranks 1..N-1; SIGABRT to rank 0, whose faulthandler writes them) and the group is killed.
tp_run() {
  local limit=$1 name=$2; shift 2
  local log="$OUT/$name.log" began=$SECONDS
  : >"$log"  # appended to by every writer below (the ranks, the time limit's note)
  # FRESH_COMPILE=1: an empty Inductor cache for this command, as a verifier's first start on a new host has (no
  # kernel choice of an earlier run to reuse)
  local fresh=()
  [ -n "${FRESH_COMPILE:-}" ] && fresh=(TORCHINDUCTOR_CACHE_DIR="$(mktemp -d /tmp/inductor-"$name".XXXX)")
  env "${fresh[@]}" NCCL_DEBUG=${NCCL_DEBUG:-WARN} PYTHONFAULTHANDLER=1 SPECD_TENSOR_PARALLEL_DUMP_S=${SPECD_TENSOR_PARALLEL_DUMP_S:-60} \
    SPECD_TENSOR_PARALLEL_TIMEOUT_S=${SPECD_TENSOR_PARALLEL_TIMEOUT_S:-120} setsid "$@" >>"$log" 2>&1 &
  local pid=$!
  ( sleep "$limit"; echo "tp_run: $name still running after $limit s: every rank's stacks follow" >>"$log"
    pkill -USR1 -P "$pid" -f spawn_main; sleep 3; kill -ABRT "$pid"; sleep 10; kill -KILL -- "-$pid" ) 2>/dev/null &
  local watch=$!
  wait "$pid"; local code=$?
  kill "$watch" 2>/dev/null
  echo "$name: exit code $code after $((SECONDS - began)) s ($log)"
  tail -n "${TAIL:-25}" "$log"
}
# tp_latency TP [TREE]: the batch-1 TP latency bench of this tree, or of TREE (.device/old: the code before a change)
tp_latency() {
  local tree=${2:-$PWD} name="tp_latency_tp$1${SPECD_TENSOR_PARALLEL_ALL_REDUCE:+_$SPECD_TENSOR_PARALLEL_ALL_REDUCE}${SPECD_BENCH_UNTUNED:+_untuned}${2:+_before}"
  tp_run 270 "$name" env -C "$tree" PYTHONPATH="/tmp/site:$tree" python3 bench/gpu_tp.py latency qwen3-8b --tp "$1" \
    --rows "$OUT/tp_latency_rows${2:+_before}.jsonl"
}
for part in "$@"; do
  case $part in
    tests) python3 -m pytest -q -p no:cacheprovider -s tests/gpu tests/engine_model/test_flash_attention.py 2>&1 | tee "$OUT/tests.log" | tail -40 ;;
    latency) models qwen3-0.6b && python3 bench/gpu_latency.py /tmp/models/qwen3-0.6b --both 2>&1 | tee "$OUT/latency.log" | tail -8 ;;
    latency8b) models llama3-8b && python3 bench/gpu_latency.py /tmp/models/llama3-8b --both 2>&1 | tee "$OUT/latency8b.log" | tail -8 ;;
    throughput) models qwen3-0.6b && python3 bench/gpu_throughput.py /tmp/models/qwen3-0.6b 2>&1 | tee "$OUT/throughput.log" | tail -9 ;;
    profile) models qwen3-0.6b && python3 bench/gpu_profile_step.py /tmp/models/qwen3-0.6b 2>&1 | tee "$OUT/profile.log" | grep "kernels per step" && python3 bench/gpu_profile_step.py /tmp/models/qwen3-0.6b --no-compile 2>&1 | tee "$OUT/profile_nocompile.log" | grep "kernels per step" ;;
    trace) models qwen3-0.6b && python3 bench/gpu_profile_step.py /tmp/models/qwen3-0.6b --trace >"$OUT/trace.log" 2>&1; grep "kernels per step" "$OUT/trace.log" ;;
    latency1) models qwen3-0.6b && python3 bench/gpu_latency.py /tmp/models/qwen3-0.6b 2>&1 | tee "$OUT/latency1.log" | tail -4 ;;
    before) models qwen3-0.6b && (cd .device/old && PYTHONPATH=/tmp/site:$PWD python3 bench/gpu_latency.py /tmp/models/qwen3-0.6b 2>&1) | tee "$OUT/latency_before.log" | tail -4 ;;
    async) models qwen3-0.6b && python3 bench/gpu_throughput.py /tmp/models/qwen3-0.6b --configs compiled,compiled+ngram-adaptive --schedule sync,async,sync,async 2>&1 | tee "$OUT/throughput_async.log" | tail -11 ;;
    enginestep) models qwen3-0.6b && python3 bench/gpu_engine_step.py /tmp/models/qwen3-0.6b 2>&1 | tee "$OUT/engine_step.log" | tail -5 ;;
    enginestep8b) models llama3-8b && python3 bench/gpu_engine_step.py /tmp/models/llama3-8b --tokens 128 2>&1 | tee "$OUT/engine_step8b.log" | tail -5 ;;
    enginestep_before) models qwen3-0.6b && (cd .device/old && PYTHONPATH=/tmp/site:$PWD python3 bench/gpu_engine_step.py /tmp/models/qwen3-0.6b 2>&1) | tee "$OUT/engine_step_before.log" | tail -5 ;;
    nanovllm|nanovllm_before) models qwen3-0.6b && for round in $(seq "${ROUNDS:-2}"); do
        bash .device/peers/run_nano_vllm.sh /tmp/models/qwen3-0.6b throughput 2>&1 | tee -a "$OUT/nanovllm.log" | tail -1
        configs=${CONFIGS:-compiled,compiled+ngram-adaptive}  # in one process; every other round in reverse order
        [ $((round % 2)) = 0 ] && configs=$(echo "$configs" | tr , '\n' | tac | paste -sd,)
        python3 bench/gpu_throughput.py /tmp/models/qwen3-0.6b --configs "$configs" --steps-out "$OUT/steps.jsonl" 2>&1 | tee -a "$OUT/throughput_vs_nano.log" | tail -3
        [ "$part" = nanovllm ] || (cd .device/old && PYTHONPATH=/tmp/site:$PWD python3 bench/gpu_throughput.py /tmp/models/qwen3-0.6b --configs compiled 2>&1) | tee -a "$OUT/throughput_before.log" | tail -2
      done
      python3 bench/step_phases.py "$OUT/steps.jsonl" | tee "$OUT/step_phases.md" ;;
    kernels) models qwen3-0.6b && python3 bench/gpu_throughput.py /tmp/models/qwen3-0.6b --configs compiled --kernels 2>&1 | tee "$OUT/kernels.log" | grep -A24 "under the profiler" | grep -v '^{'
      PYTHONPATH=/tmp/peer-site:$PWD/.device/peers/nano-vllm:$PYTHONPATH python3 bench/nano_kernels.py /tmp/models/qwen3-0.6b 2>&1 | tee "$OUT/nano_kernels.log" | grep -A24 "under the profiler" ;;
    sampler) python3 bench/gpu_sampler.py 2>&1 | tee "$OUT/sampler.log" | tail -7 ;;
    eager) models qwen3-0.6b && python3 bench/gpu_throughput.py /tmp/models/qwen3-0.6b --eager 2>&1 | tee "$OUT/throughput_eager.log" | tail -8 ;;
    tpsmoke) TAIL=12 tp_run 90 tp_smoke_eager python3 bench/gpu_tp.py smoke eager --tp 2
      TAIL=12 tp_run 120 tp_smoke_graphs python3 bench/gpu_tp.py smoke graphs --tp 2
      TAIL=12 tp_run 180 tp_smoke_compiled python3 bench/gpu_tp.py smoke compiled --tp 2 ;;
    tptests) logits=tests/gpu/test_tensor_parallel.py::test_sharded_logits_equal_one_gpu_in_bf16_eager_and_replayed
      for case in 2-one-shot 4-one-shot; do  # each in a process of its own: torch binds symmetric memory once per process
        TAIL=4 tp_run 200 "tp_tests_$case" python3 -m pytest -q -p no:cacheprovider -s "$logits[$case]"
      done
      TAIL=40 tp_run 420 tp_tests python3 -m pytest -q -p no:cacheprovider -s -o log_cli=true --log-cli-level=INFO \
        tests/gpu/test_tensor_parallel.py tests/gpu/test_one_shot_all_reduce.py --deselect "$logits[2-one-shot]" --deselect "$logits[4-one-shot]" ;;
    tpdefaultmodel) mkdir -p /tmp/gguf && cat /tmp/gguf.part1 .device-part2/gguf.part2 >/tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
      TAIL=12 SPECD_DEFAULT_GGUF=/tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf SPECD_HOME=/tmp/specd-home tp_run 420 \
        tp_default_model python3 -m pytest -q -p no:cacheprovider -s tests/gpu/test_default_model.py \
        tests/gpu/test_tensor_parallel.py::test_default_model_greedy_with_speculation_equals_without_on_two_ranks ;;
    verifytest|verifytest_before) tree=$PWD; [ "$part" = verifytest ] || tree=$PWD/.device/old
      (cd "$tree" && PYTHONPATH=/tmp/site:$PWD python3 -m pytest -q -p no:cacheprovider tests/gpu/test_triton_verify.py \
        tests/gpu/test_graphs_and_engine.py tests/gpu/test_compiled_layers.py tests/gpu/test_flash_backend.py 2>&1) |
      tee "$OUT/$part.log" | tail -4 ;;
    pdltest) python3 -m pytest -q -p no:cacheprovider tests/gpu/test_pdl.py 2>&1 | tee "$OUT/pdl_test.log" | tail -8 ;;
    tplogits2) TAIL=4 tp_run 200 tp_logits_2 python3 -m pytest -q -p no:cacheprovider -s \
      "tests/gpu/test_tensor_parallel.py::test_sharded_logits_equal_one_gpu_in_bf16_eager_and_replayed[2-one-shot]" ;;
    graphtimingtest) python3 -m pytest -q -p no:cacheprovider tests/gpu/test_graph_timing.py 2>&1 | tee "$OUT/graph_timing_test.log" | tail -3 ;;
    oneshottest) TAIL=6 tp_run 150 one_shot_test python3 -m pytest -q -p no:cacheprovider -s tests/gpu/test_one_shot_all_reduce.py ;;
    tplatency) for tp in 1 2 4; do tp_latency $tp; done ;;
    tplatency1|tplatency2|tplatency4) tp_latency "${part#tplatency}" ;;
    tplatency1_before|tplatency2_before) p=${part#tplatency}; tp_latency "${p%_before}" "$PWD/.device/old" ;;
    tpkernels1|tpkernels2) tp=${part#tpkernels}; TAIL=60 tp_run 300 "tp_kernels_tp$tp" python3 bench/gpu_tp.py latency qwen3-8b --tp "$tp" --tokens 64 --kernels ;;
    tplatency2nccl|tplatency4nccl) p=${part#tplatency}; SPECD_TENSOR_PARALLEL_ALL_REDUCE=nccl tp_latency "${p%nccl}" ;;
    tplatency1untuned|tplatency2untuned) p=${part#tplatency}; SPECD_BENCH_UNTUNED=1 tp_latency "${p%untuned}" ;;
    allreduce) TAIL=14 tp_run 240 allreduce python3 bench/gpu_allreduce.py ;;
    allreduce_before) TAIL=14 tp_run 240 allreduce_before env -C .device/old PYTHONPATH="/tmp/site:$PWD/.device/old" \
      python3 bench/gpu_allreduce.py ;;
    tptimeline1|tptimeline2) tp=${part#tptimeline}
      TAIL=8 tp_run 300 "tp_timeline_tp$tp" python3 bench/gpu_tp.py latency qwen3-8b --tp "$tp" --tokens 64 \
        --timeline "$OUT/timeline" --rows "$OUT/tp_timeline_rows.jsonl"
      python3 bench/tp_timeline.py "$OUT/timeline/tp$tp" | tee "$OUT/tp_timeline_tp$tp.md" ;;
    tplatency70b) tp_run 300 tp_latency70b python3 bench/gpu_tp.py latency llama3-70b --tp 4 --speculation --rows "$OUT/tp_latency_rows.jsonl" ;;
    tpthroughput) models qwen3-8b && bash .device/peers/run_nano_vllm.sh /tmp/models/qwen3-8b tp2 2>&1 | tee "$OUT/nano_tp2.log" | tail -3
      tp_run 420 tp_throughput python3 bench/gpu_tp.py throughput /tmp/models/qwen3-8b --tp 2 --num-seqs 128 --peer-log "$OUT/nano_tp2.log" ;;
  esac
done
