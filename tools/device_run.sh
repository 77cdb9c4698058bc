#!/usr/bin/env bash
# Sets up the GPU machine (wheels from .device/, random checkpoints) and runs what is asked, in one call:
#   bash tools/device_run.sh [tests] [latency] [latency8b] [latency1] [before] [throughput] [async] [eager]
#                            [profile] [trace] [nanovllm] [nanovllm_before] [kernels] [verifytest]
#                            [verifytest_before] [pdltest] [graphtimingtest] [tptests] [tplogits2] [oneshottest]
#                            [tpdefaultmodel]
# latency / latency8b: batch-1 decode and verify steps of Qwen3-0.6B / Llama-3-8B shapes (python -m bench.gpu_latency,
# eager layers and compiled); latency1: batch-1 latency, compiled only; before / throughput_before: latency1 /
# throughput of the code in .device/old
# (e.g. `git archive HEAD | tar -x -C .device/old` before a change), to compare before / after on the same machine
# in one call. throughput: nano-vllm's workload (python -m bench.gpu_throughput); async: the same with async
# scheduling on and off, alternating; eager: without CUDA graphs. profile: one decode step's kernels by CUDA time
# (python -m bench.profile_step, compiled and not); trace: ordered kernels of one decode and one verify step.
# nanovllm: specd's throughput (speculation off / on, async) alternating with nano-vllm's own bench.py on the same
# workload and card (peers in .device/peers; specd's configurations in one process, their order reversed every
# other round, every step's stats in $OUT/steps.jsonl); nanovllm_before: the same with the code in .device/old as a
# third column; kernels: specd's device time on that workload by kernel family.
# verifytest / verifytest_before = the attention and engine GPU tests of this tree / of the code in .device/old.
# pdltest = tests/gpu/test_pdl.py; graphtimingtest = tests/gpu/test_graph_timing.py alone.
# Tensor parallelism (a machine of 2 or 4 GPUs; each part has its own time limit, see tp_run): tptests = the TP GPU
# tests (~5 min: five model builds, four compiled anew; with the one-shot all-reduce's own, which oneshottest runs
# alone, ~1 min; the one-shot logits cases first, each in a process of its own, since torch binds a process's
# symmetric memory to its first process group); tplogits2 = the TP tests' one-shot logits case at 2 ranks alone
# (part of tptests). NCCL's NVLink multicast stays off as the machine sets it (NCCL_NVLS_ENABLE=0).
# tpdefaultmodel = the default model's GPU tests, TP 1 and 2. Its 98 MB GGUF exceeds one call's carry, so it comes in
# two pieces over two calls made back to back: G=~/.cache/specd/gguf/*.gguf (fetched by python -m specd.default_model);
# head -c 50331648 $G >.device/gguf.part1; tail -c +50331649 $G >.device-part2/gguf.part2; the first call carries
# .device and copies the piece to /tmp/gguf.part1, the second carries .device-part2 and runs this part.
# The diagnosis parts of earlier rounds (enginestep, sampler, allreduce, tpsmoke, tplatency*, tpkernels*, tptimeline*,
# tpthroughput) ran scripts retired from bench/ (docs/BENCHMARKS.md, "Retired diagnosis tools"); this script as it
# ran them is in git history at commit 2e60c5c (bench/device_run.sh).
# Results and logs go to $OUT (or /tmp/out); each part prints a short table at the end. tools/device_call.sh runs
# lanes of parts side by side on different GPUs within a time limit and packs $OUT into one archive.
set -u
OUT=${OUT:-/tmp/out}
# Installed once per machine, so that several parts may run side by side (on different GPUs) in one call.
[ -f /tmp/site/.specd-installed ] || { python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/*.whl &&
  touch /tmp/site/.specd-installed; } || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
bash tools/build_native_store.sh . .device/old  # the drafter's native store, here and in the code measured against
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader | tee "$OUT/card.txt"
models() { for p in "$@"; do [ -d "/tmp/models/$p" ] || python3 -m bench.make_random_model "$p" "/tmp/models/$p" >/dev/null; done; }
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
for part in "$@"; do
  case $part in
    tests) python3 -m pytest -q -p no:cacheprovider -s tests/gpu tests/engine_model/test_flash_attention.py 2>&1 | tee "$OUT/tests.log" | tail -40 ;;
    latency) models qwen3-0.6b && python3 -m bench.gpu_latency /tmp/models/qwen3-0.6b --both 2>&1 | tee "$OUT/latency.log" | tail -8 ;;
    latency8b) models llama3-8b && python3 -m bench.gpu_latency /tmp/models/llama3-8b --both 2>&1 | tee "$OUT/latency8b.log" | tail -8 ;;
    throughput) models qwen3-0.6b && python3 -m bench.gpu_throughput /tmp/models/qwen3-0.6b ${TP_CONFIGS:+--configs "$TP_CONFIGS"} 2>&1 | tee "$OUT/throughput.log" | tail -9 ;;
    profile) models qwen3-0.6b && python3 -m bench.profile_step /tmp/models/qwen3-0.6b 2>&1 | tee "$OUT/profile.log" | grep "kernels per step" && python3 -m bench.profile_step /tmp/models/qwen3-0.6b --no-compile 2>&1 | tee "$OUT/profile_nocompile.log" | grep "kernels per step" ;;
    trace) models qwen3-0.6b && python3 -m bench.profile_step /tmp/models/qwen3-0.6b --trace >"$OUT/trace.log" 2>&1; grep "kernels per step" "$OUT/trace.log" ;;
    latency1) models qwen3-0.6b && python3 -m bench.gpu_latency /tmp/models/qwen3-0.6b 2>&1 | tee "$OUT/latency1.log" | tail -4 ;;
    before) models qwen3-0.6b && (cd .device/old && PYTHONPATH=/tmp/site:$PWD python3 -m bench.gpu_latency /tmp/models/qwen3-0.6b 2>&1) | tee "$OUT/latency_before.log" | tail -4 ;;
    throughput_before) models qwen3-0.6b && (cd .device/old && PYTHONPATH=/tmp/site:$PWD python3 -m bench.gpu_throughput /tmp/models/qwen3-0.6b ${TP_CONFIGS:+--configs "$TP_CONFIGS"} 2>&1) | tee "$OUT/throughput_before.log" | tail -9 ;;
    async) models qwen3-0.6b && python3 -m bench.gpu_throughput /tmp/models/qwen3-0.6b --configs compiled,compiled+ngram-adaptive --schedule sync,async,sync,async 2>&1 | tee "$OUT/throughput_async.log" | tail -11 ;;
    nanovllm|nanovllm_before) models qwen3-0.6b && for round in $(seq "${ROUNDS:-2}"); do
        bash .device/peers/run_nano_vllm.sh /tmp/models/qwen3-0.6b throughput 2>&1 | tee -a "$OUT/nanovllm.log" | tail -1
        configs=${CONFIGS:-compiled,compiled+ngram-adaptive}  # in one process; every other round in reverse order
        [ $((round % 2)) = 0 ] && configs=$(echo "$configs" | tr , '\n' | tac | paste -sd,)
        python3 -m bench.gpu_throughput /tmp/models/qwen3-0.6b --configs "$configs" --steps-out "$OUT/steps.jsonl" 2>&1 | tee -a "$OUT/throughput_vs_nano.log" | tail -3
        [ "$part" = nanovllm ] || (cd .device/old && PYTHONPATH=/tmp/site:$PWD python3 -m bench.gpu_throughput /tmp/models/qwen3-0.6b --configs compiled 2>&1) | tee -a "$OUT/throughput_before.log" | tail -2
      done ;;
    kernels) models qwen3-0.6b && python3 -m bench.gpu_throughput /tmp/models/qwen3-0.6b --configs compiled --kernels 2>&1 | tee "$OUT/kernels.log" | grep -A24 "under the profiler" | grep -v '^{' ;;
    eager) models qwen3-0.6b && python3 -m bench.gpu_throughput /tmp/models/qwen3-0.6b --eager 2>&1 | tee "$OUT/throughput_eager.log" | tail -8 ;;
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
  esac
done
