#!/usr/bin/env bash
# The GPU machine's side of the whole-stack measurements (python -m bench.stack), in parts, in one call:
#   bash tools/device_stack.sh PART...
# random  : random weights of the default model's shapes with its real tokenizer (.device/model): the stack beside its
#           engine alone at 1 / 16 / 64 / 256 clients, speculation off; then one decode and one verify step's kernels
#           (python -m bench.profile_step --trace --graph)
# pyspy   : py-spy over every process of the stack at 256 clients (random weights, k = 0)
# pyspy_real: py-spy over every process of the stack, then of its engine alone on the same requests: the real weights,
#           PYSPY_CLIENTS (16) clients, k = PYSPY_KS (4), memory off, 384 requests (the stack's engine thread runs
#           under engine_loop, the engine alone's under bench/stack.py's _closed_loop)
# steady  : the stack beside its engine at 64 / 256 clients, 600 requests a run, twice (random weights, k = 0)
# throughput: the same random weights at 64 and 256 clients only, speculation off, stack beside engine
# dettrace: one step's kernels in the default and the deterministic mode (random weights of the default model)
# prefill : where a prompt's time to first token goes (python -m bench.profile_step --prefill)
# final   : the real weights (as `real` gets them), this tree at 1 / 16 / 64 / 256 clients with speculation off and on
#           beside its engine alone and Hugging Face at batch 1; FINAL_REQUESTS (512) a run at 16-256 clients
# ab64    : this tree and .device/old in turn, twice each: random weights, 64 clients, speculation off, stack only
# ab      : this tree and .device/old in turn, twice each: the real weights, AB_CLIENTS (1 16 64) clients, k = 0 and 4
# abgw    : the front door, this tree and .device/old in turn (new, old, old, new): random weights of the default model's
#           shapes with its real tokenizer, 64 and 256 clients, k = 0, stack only (needs no GGUF: one call)
# gwprocs : this tree with --gateway-processes each of GW_PROCS (2 4): random weights as abgw's, 64 and 256 clients,
#           k = 0, stack only (each run's gateway CPU a token at that process count)
# transport: this tree with --verifier-transport each of TRANSPORTS (socket grpc): random weights as abgw's, 64 and
#           256 clients, k = 0, stack only (the gateways' and the verifier's CPU a token over each)
# policy  : the real weights, --draft-policy goodput at 1 / 16 / 64 clients (k = 0, 4), then batch-size at 16 / 64 (k = 4)
# spec    : the real weights, 1 and 16 clients (SPEC_CLIENTS), speculation off and on (SPEC_KS): this tree (with its
#           engine alone; SPEC_ARGS: more of its arguments, e.g. --hf 4), then .device/old (stack only)
# old     : the same stack runs for the code in .device/old (the commit measured against), stack only
# real    : the default model's real weights (its GGUF joined from .device/gguf.part1, kept from the call before,
#           and .device-part2/gguf.part2): the stack with speculation off and on, drafter memory off, then a second
#           stack with memory on, each prompt set twice (the second pass drafts from the first's outputs)
# old_real: `real` for the code in .device/old (git archive of the commit measured against), first, in the same call
# sched   : every thread's CPU and run-queue wait (tools/thread_sched.py) over the stack beside its engine at 64
#           clients, k = 0, with default torch threads, then OMP_NUM_THREADS=1, then the default again
# enginethread: the engine alone (random weights, 64 clients, k = 0) on the main thread and on one of its own, in
#           turns, with default torch threads and with OMP_NUM_THREADS=1
# interval: --stream-interval 1 against 8 through the stack (real weights, 64 / 256 clients, k = 0)
# model   : only converts the real weights (before lanes that use them start side by side)
# stack_new / stack_old: the real weights, 1 / 16 / 64 / 256 clients, speculation off and on, stack only, for this tree
#           / .device/old (ports + 900, or + PORT_OFFSET), to run side by side on two GPUs (tools/device_call.sh lanes);
#           this tree with and without a switch: "0 stack_new" "1 SPECD_PIECEWISE_GRAPHS=0 PORT_OFFSET=900 stack_new"
# ttft    : the real weights, 1 and 16 clients, speculation off and on, 24 requests at one client, stack only
# piecetests: the GPU tests of the CUDA graphs (decode / verify steps and the model's pieces)
# stack_engine: the same for this tree, each run beside its engine alone on the same requests
# engine_new / engine_old: the engine benches (device_run.sh latency1 throughput / before throughput_before);
# engine_throughput: device_run.sh throughput alone (TP_CONFIGS=compiled picks one configuration)
# timeline / timeline_real: the engine's own loop at one request (and at TIMELINE_BATCH's size), k = 0 and 4
#           (python -m bench.step_timeline): device busy and idle a step, the idle split by the host's stage; random
#           weights of the default model's shapes / the real weights
# fewrows : `timeline` with SPECD_FEW_ROW_GEMMS=each of FEWROWS (triton), then FEWROWS_BASE (cublas)
# gemmrows: a step's projections (the default model's shapes) by row count, cuBLAS against the Triton GEMM
# envs_stack: the real weights through the stack once under each VAR=value of ENVS, 1 and 16 clients (ENVS_CLIENTS),
#           k = 0 and 4, memory off, stack only
# linkprof: py-spy over every process of the stack, and every thread's CPU and run-queue wait (tools/thread_sched.py),
#           the real weights, 16 clients, k = 4, memory off, 384 requests, stack only: with its drafter link, then with
#           `--drafter-addr in-process` (why the link's k = 4 steps take 0.14-0.24 ms longer, round 46)
# wakecost: tools/wake_cost.py on this host's CPUs (no model, no GPU): what waking a helper through a pipe costs a
#           thread that keeps working, with the helper as it is, as SCHED_BATCH and kept off the writer's CPU
# linkab  : the real weights, 16 clients, k = 4, memory off, 384 requests, stack only, in turns (LINKAB_RUNS, comma-separated
#           DRAFTER:RUN, RUN as run_as names it; by default: the link asking every step, under
#           SPECD_DRAFTER_PROBE_STEPS=8 (probe8; probe1000 asks a request's first step only), in-process drafting,
#           probe8, the link again). Other runs: batch (the link process as
#           SCHED_BATCH: the engine thread's pipe write no longer lets it preempt the engine thread), pin (the engine
#           thread alone on the last CPU, the rest of the stack on the others), .device/old (the tree measured against):
#           whether the link's cost is its own work, its wake-ups or the machine's (variants are this tree with one edit
#           each, made here: `variant`); LINKAB_MODEL=random runs them on random weights of the default model's shapes
#           (no GGUF: one call); LINKAB_KS (4): the speculation settings of each run (0 4: on against off)
# pinab   : random weights of the default model's shapes, 64 and 256 clients, k = 0, 512 requests, the stack in turns
#           (PINAB_RUNS): this tree (beside its engine alone), pin, this tree again (readerbatch: the serving process's
#           step-message reader as SCHED_BATCH, by name): whether issue #34's stack-against-engine gap is the engine
#           thread sharing its CPU with the threads it wakes (needs no GGUF: a first call's part)
# drafters: the real weights, DRAFTERS_CLIENTS (16) clients, k = 0 and 4, memory off, DRAFTERS_REQUESTS (384) a run:
#           the stack with its drafter link, then with `--drafter-addr in-process` (the drafter's rule in the engine
#           process, as the engine alone drafts), then in-process, then the link (DRAFTERS_ORDER; the engine alone
#           beside the first)
# maxrows : `timeline` at 1 and 16 requests with SPECD_FEW_ROW_GEMMS_MAX_ROWS=each of MAXROWS (128 64) in one call:
#           whether a 16-request verify step's 80-row GEMMs pay on the Triton GEMM (round 43's lead)
# splitk  : `timeline` with the Triton GEMM's K split (SPECD_FEW_ROW_GEMMS_SPLIT_K=1), then whole (0)
# fewrows_stack: the real weights through the stack, 1 and 16 clients, k = 0 and 4, memory off, with
#           SPECD_FEW_ROW_GEMMS=each of FEWROWS (triton) then FEWROWS_BASE (cublas), stack only
# kernels : one decode and one verify step's kernels (bench.profile_step --trace --graph, the default model's shapes),
#           at batch 1 and at each of KERNELS_BATCH's sizes
# stalls  : the real weights, drafter memory on, k = 4, 500 prompts twice at 1 and at 16 clients: the verifier's
#           stalls (specd_step_stalls_total) and the slow steps it logged
# verifycost: the real weights, one client, k = 0 and 4, memory off: the engine's mean step and stages
# soak_bg / soak_wait: `soak` in a process session of its own that outlives the call (SOAK_S: 600), then a next call,
#           made at once, waits for it and brings back its log and report
# soak    : the real weights, python -m bench.soak on the GPU (two verifiers on it, 64 clients, SOAK_S s: 420;
#           SOAK_ARGS: more of its arguments, --deterministic for outputs that must equal the reference exactly)
# gputests: the GPU suite (device_run.sh tests), with the real weights for tests/gpu/test_default_model.py
# detkernels / dettests: tests/gpu/test_deterministic_cuda.py, its kernel tests alone / all of it (real weights)
# defaulttest: tests/gpu/test_default_model.py (real weights), each differing prompt's top-2 gap printed
# detgemms: bench.deterministic (the default model's shapes, random weights): the default mode, then the
#           deterministic mode under each SPECD_DETERMINISTIC_GEMMS of DET_GEMMS (cublas triton triton-split)
# detab   : bench.deterministic on the default model's shapes (random weights) for each NAME:TREE of DETAB_TREES
#           (new:. old:.device/old new2:.), the first in both modes, the rest the deterministic mode alone
# detbench / detbench_8b / detbench_135m: python -m bench.deterministic on the real weights / Qwen3-8B's or the
#           default model's shapes at random (DET_ARGS: more of its arguments)
# The GGUF (98 MB) is over one call's carry: the first call carries .device with gguf.part1 (the first 38,000,000
# bytes of ~/.cache/specd/gguf/SmolLM2-135M-Instruct.Q4_1.gguf), the next one, made at once (the machine stays warm
# for 30 s), carries .device-part2 with the rest. Results: $OUT/*.jsonl and *.log; each part's table printed last.
set -u
OUT=${OUT:-/tmp/out}
[ -f /tmp/site/.specd-installed ] || { python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/*.whl &&
  touch /tmp/site/.specd-installed; } || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 SPECD_HOME=/tmp/specd
bash tools/build_native_store.sh . .device/*/  # every tree carried (.device/old, other variants)
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader | tee "$OUT/card.txt"
[ -f .device/gguf.part1 ] && cp .device/gguf.part1 /tmp/gguf.part1

default_model() {  # the real weights, converted once per machine
  [ -f /tmp/gguf/model.gguf ] || { [ -f .device-part2/gguf.part2 ] && mkdir -p /tmp/gguf &&
    cat /tmp/gguf.part1 .device-part2/gguf.part2 > /tmp/gguf/model.gguf; } || { echo "no GGUF"; return 1; }
  SPECD_DEFAULT_GGUF=/tmp/gguf/model.gguf python3 -m specd.default_model 2>&1 | tail -1
}

# Requests a run of stack_engine / stack_new / stack_old at 16-256 clients: 600 runs several waves at 256 (at 128,
# round 28's runs lasted 0.75-2.9 s, and the first wave's time to first token weighed on them)
REQUESTS=${STACK_REQUESTS:-600}
CLIENTS=${STACK_CLIENTS:-1 16 64 256}  # client counts of stack_engine / stack_new / stack_old

# This tree's bench package alone in a folder of its own, so that `stack` runs it over the code of any tree
mkdir -p /tmp/bench-root && ln -sfn "$PWD/bench" /tmp/bench-root/bench

stack() {  # stack TREE NAME ARGS...: this tree's bench.stack over the code in TREE, its table last
  local tree name=$2; tree=$(cd "$1" && pwd); shift 2
  (cd /tmp/bench-root && PYTHONPATH=/tmp/site:$tree SPECD_DEFAULT_GGUF=/tmp/gguf/model.gguf \
    timeout -s INT "${LIMIT:-560}" ${PROFILER:-} python3 -m bench.stack --device cuda --out "$OUT/$name.jsonl" \
      --stack-log "$OUT/$name.stack.log" "$@") >"$OUT/$name.log" 2>&1
  echo "== $name (exit $?)"; grep -v " INFO \| WARNING " "$OUT/$name.log" | tail -n "${TAIL:-14}"
}

pyspy_stack() {  # pyspy_stack NAME ARGS...: `stack . NAME ARGS...` under py-spy (.device/tools/py_spy-*.whl), every
  # process, raw stacks with thread ids, idle included, into $OUT/NAME.txt
  [ -x /tmp/pyspy/bin/py-spy ] || python3 -m pip install -q --no-index --no-deps --target /tmp/pyspy .device/tools/py_spy-*.whl
  PROFILER="/tmp/pyspy/bin/py-spy record --subprocesses --idle --threads -r 100 -f raw -o $OUT/$1.txt --" \
    LIMIT=300 stack . "$@"
}

variant() {  # variant NAME: this tree with one experiment's edit, in /tmp/variants/NAME (its path printed)
  local dir=/tmp/variants/$1
  rm -rf "$dir" && mkdir -p "$dir" && cp -r setup.py specd specd_cli gateway verifier_service drafter_service bench "$dir/"
  rm -f "$dir"/drafter_service/_native_store*.so
  python3 - "$dir" "$1" <<'PY' || return 1
import sys
edits = {  # NAME: (file, the line as it is, the line instead)
    "pin": ("verifier_service/engine_loop.py", "    def _run(self) -> None:",
            "    def _run(self) -> None:\n        import os; os.sched_setaffinity(0, {os.cpu_count() - 1})  # experiment"),
    # the drafter link's process, and the serving process's reader of the step messages, as SCHED_BATCH: woken by the
    # engine thread's pipe write (a synchronous wake-up), they no longer preempt it
    "batch": ("drafter_service/link.py",
              "    stop_signals.die_with_parent(signal.SIGKILL, parent_pid)  # nothing of its state outlives the engine",
              "    stop_signals.die_with_parent(signal.SIGKILL, parent_pid)\n"
              "    os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))  # experiment"),
    "readerbatch": ("verifier_service/engine_process.py", "    def _read(self) -> None:",
                    "    def _read(self) -> None:\n"
                    "        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))  # experiment"),
}
path, old, new = edits[sys.argv[2]]
path = f"{sys.argv[1]}/{path}"
text = open(path).read()
assert text.count(old) == 1, f"{path}: the line to edit is not there once"
open(path, "w").write(text.replace(old, new))
PY
  bash tools/build_native_store.sh "$dir" >&2
  echo "$dir"
}

run_as() {  # run_as NAME: the tree, profiler and SPECD_DRAFTER_PROBE_STEPS of a run named . (this tree), probeN (this
  # tree with SPECD_DRAFTER_PROBE_STEPS=N), pin (its variant, the rest of the stack kept off the engine's CPU), a tree
  # carried (.device/old) or another variant
  tree=$1 profiler="" probe_steps=1
  case $1 in
    probe[0-9]*) tree=. probe_steps=${1#probe} ;;
    pin) profiler="taskset -c 0-$(($(nproc) - 2))" ;;
  esac
  [ "$tree" = . ] || [ -d "$tree" ] || tree=$(variant "$tree")  # a tree carried (.device/old) runs as it is
}

random_model() {  # random weights of the default model's shapes, with its real tokenizer (.device/model), once
  [ -d /tmp/models/smollm2-135m ] || python3 -m bench.make_random_model smollm2-135m /tmp/models/smollm2-135m .device/model
}

det_model() {  # det_model SHAPES (8b or 135m): the config-only random checkpoint with the default model's tokenizer
  local dir=.device/smollm2-135m-det f; [ "$1" = 8b ] && dir=.device/qwen3-8b-det
  for f in tokenizer.json tokenizer_config.json chat_template.jinja generation_config.json; do cp .device/model/$f "$dir/"; done
  echo "$dir"
}

trace_kernels() {  # one decode and one verify step's kernels (k = 4, CUDA graphs), the default model's shapes
  local size
  random_model
  for size in 1 ${KERNELS_BATCH:-}; do
    timeout 300 python3 -m bench.profile_step /tmp/models/smollm2-135m --trace --graph --batch "$size" \
      > "$OUT/kernels_$size.log" 2>&1
    echo "== kernels, batch $size"; grep "kernels per step\|by family" "$OUT/kernels_$size.log"
  done
}

timelines_under() {  # timelines_under NAME VAR VALUE...: bench.step_timeline (random weights) once with VAR=each VALUE
  local name=$1 var=$2 value; shift 2
  random_model
  for value in "$@"; do
    # shellcheck disable=SC2086  # TIMELINE_ARGS: more bench.step_timeline arguments; FEWROWS_ARGS: verifier options
    env "$var=$value" timeout "${FEWROWS_LIMIT:-200}" python3 -m bench.step_timeline --model /tmp/models/smollm2-135m \
      --device cuda --steps 300 --out "$OUT/${name}_$value.json" ${TIMELINE_ARGS:-} -- ${FEWROWS_ARGS:-} \
      > "$OUT/${name}_$value.log" 2>&1
    echo "== $var=$value (exit $?)"; grep -v Warning "$OUT/${name}_$value.log" | tail -n 7
  done
}

# The soak's command (the real weights, two verifiers sharing the GPU, 64 clients); SOAK_ARGS: more of its arguments
# shellcheck disable=SC2206
SOAK=(python3 -m bench.soak --device cuda --dtype bfloat16 --kv-cache-bytes $((8 << 30)) --clients 64 ${SOAK_ARGS:-})

for part in "$@"; do
  case $part in
    random)
      random_model
      stack . random --model /tmp/models/smollm2-135m --clients 1 16 64 256 --ks 0 --num-requests 256
      trace_kernels ;;
    pyspy)  # where each process of the stack spends a 256-client run (random weights, speculation off, 600
      # requests): py-spy over all of them (.device/tools/py_spy-*.whl), raw stacks with thread ids, idle included
      random_model
      pyspy_stack pyspy --model /tmp/models/smollm2-135m --clients 256 --ks 0 --num-requests 600 --passes 3 --no-engine ;;
    pyspy_real) default_model || continue  # round 45: the stack's k = 4 steps at 16 clients took 1.22 ms to launch,
      # the engine alone's 0.74
      # shellcheck disable=SC2086
      pyspy_stack pyspy_real --clients ${PYSPY_CLIENTS:-16} --ks ${PYSPY_KS:-4} --num-requests 384 ;;
    steady)  # random weights, 64 and 256 clients, speculation off, 600 requests a run, twice: the stack beside its engine
      random_model
      LIMIT=${STACK_LIMIT:-400} stack . steady --model /tmp/models/smollm2-135m --clients 64 256 --ks 0 --num-requests 600 --passes 2 ;;
    throughput)
      random_model
      LIMIT=400 stack . throughput --model /tmp/models/smollm2-135m --clients 64 256 --ks 0 --num-requests 256 ;;
    final)
      default_model || continue
      LIMIT=420 stack . final_new --clients 1 16 64 256 --ks 0 4 --num-requests "${FINAL_REQUESTS:-512}" --hf 10 ;;
    old) default_model || continue
      LIMIT=300 stack .device/old final_old --clients 1 16 64 256 --ks 0 4 --num-requests 128 --no-engine --port-offset 900 ;;
    ab64)  # this tree and .device/old alternating, random weights, 64 clients, speculation off
      random_model
      for round in 1 2; do
        TAIL=3 LIMIT=120 stack . "ab64_new$round" --model /tmp/models/smollm2-135m --clients 64 --ks 0 --num-requests 256 --no-engine
        TAIL=3 LIMIT=120 stack .device/old "ab64_old$round" --model /tmp/models/smollm2-135m --clients 64 --ks 0 --num-requests 256 --no-engine --port-offset 900
      done ;;
    policy)  # the draft policy: goodput (this tree's default) against batch-size, same requests, stack only
      default_model || continue
      LIMIT=230 stack . policy_goodput --clients 1 16 64 --ks 0 4 --num-requests 128 --no-engine
      LIMIT=150 stack . policy_batch_size --clients 16 64 --ks 4 --num-requests 128 --no-engine --port-offset 900 \
        -- --draft-policy batch-size ;;
    spec)  # SPEC_CLIENTS (1 16), SPEC_KS (0 4: this tree's; .device/old runs 0 4), SPEC_REQUESTS (128), SPEC_BATCH1 (24)
      default_model || continue  # SPEC_ARGS: more of this tree's bench.stack arguments (--hf 4)
      requests="--num-requests ${SPEC_REQUESTS:-128} --batch1-requests ${SPEC_BATCH1:-24}"
      # shellcheck disable=SC2086
      LIMIT=${SPEC_LIMIT:-230} stack . spec_new --clients ${SPEC_CLIENTS:-1 16} --ks ${SPEC_KS:-0 4} $requests \
        ${SPEC_ARGS:-}
      # shellcheck disable=SC2086
      LIMIT=150 stack .device/old spec_old --clients ${SPEC_CLIENTS:-1 16} --ks 0 4 $requests --no-engine \
        --port-offset 900 ;;
    ab)  # this tree and .device/old in turn, twice each: the real weights, AB_CLIENTS (1 16 64), k = 0 and 4, stack
      # only (the engine alone once, first, beside this tree's first run); 512 requests a run (SPEC_REQUESTS): at 64
      # clients 256 took 1.4-1.8 s, and one run of each tree disagreed with another (round 39); the GPU image's
      # standard library gives 632 distinct instruction prompts, so 768 stopped at once (round 42)
      default_model || continue
      requests="--num-requests ${SPEC_REQUESTS:-512} --batch1-requests ${SPEC_BATCH1:-48} --ks 0 4"
      # shellcheck disable=SC2086
      for round in ${AB_ROUNDS:-1 2}; do
        engine=--no-engine; [ "$round" = 1 ] && [ -z "${AB_NO_ENGINE:-}" ] && engine=
        for tree in ${AB_ORDER:-new old}; do  # AB_ORDER="old new": the old tree first in each round
          if [ "$tree" = new ]; then
            TAIL=8 LIMIT=${AB_LIMIT_NEW:-200} stack . "ab_new$round" --clients ${AB_CLIENTS:-1 16 64} $requests $engine
          else
            TAIL=8 LIMIT=${AB_LIMIT_OLD:-150} stack .device/old "ab_old$round" --clients ${AB_CLIENTS:-1 16 64} $requests \
              --no-engine --port-offset 900
          fi
        done
      done ;;
    abgw)  # each run's gateway CPU a token is the number compared
      random_model; run=0
      for tree in ${ABGW_ORDER:-new old old new}; do
        dir=.; offset=800; [ "$tree" = old ] && dir=.device/old offset=900
        # shellcheck disable=SC2086
        TAIL=4 LIMIT=${AB_LIMIT_NEW:-140} stack "$dir" "abgw_$tree$((++run))" --model /tmp/models/smollm2-135m \
          --clients 64 256 --ks 0 --num-requests "${SPEC_REQUESTS:-512}" --no-engine --port-offset $offset
      done ;;
    gwprocs) random_model  # the front door's process count at 64 / 256 clients (issue #34)
      for procs in ${GW_PROCS:-2 4}; do
        TAIL=4 LIMIT=${AB_LIMIT_NEW:-140} stack . "gw$procs" --model /tmp/models/smollm2-135m --clients 64 256 \
          --ks 0 --num-requests "${SPEC_REQUESTS:-512}" --no-engine -- --gateway-processes "$procs"
      done ;;
    transport) random_model  # the gateways' request streams over the Serve socket against gRPC Serve (issue #34)
      for transport in ${TRANSPORTS:-socket grpc}; do
        TAIL=4 LIMIT=${AB_LIMIT_NEW:-140} stack . "tr_$transport" --model /tmp/models/smollm2-135m --clients 64 256 \
          --ks 0 --num-requests "${SPEC_REQUESTS:-512}" --no-engine -- --verifier-transport "$transport"
      done ;;
    sched)  # why the stack's engine thread is slower than its engine alone at 64 clients: every python thread's CPU
      default_model || continue  # time, run-queue wait and switches (tools/thread_sched.py), default torch threads,
      # then OMP_NUM_THREADS=1 (vLLM's default for its GPU processes), then the default again; stack beside engine
      python3 tools/thread_sched.py "$OUT/sched.jsonl" --interval 0.5 --duration 540 & sampler=$!
      for run in default1 omp1 default2; do
        echo "$run $(date +%s.%N)" >> "$OUT/sched_marks.txt"
        if [ "$run" = omp1 ]; then export OMP_NUM_THREADS=1; else unset OMP_NUM_THREADS; fi
        TAIL=6 LIMIT=150 stack . "sched_$run" --clients ${SCHED_CLIENTS:-64} --ks 0 --num-requests 600 --passes 3
      done
      unset OMP_NUM_THREADS; echo "end $(date +%s.%N)" >> "$OUT/sched_marks.txt"; kill "$sampler"
      python3 tools/thread_sched.py --summary "$OUT/sched.jsonl" > "$OUT/sched_summary.txt"  # the samples are over
      rm -f "$OUT/sched.jsonl" "$OUT"/sched_*.stack.log; echo "== busiest threads"; tail -n 30 "$OUT/sched_summary.txt" ;;  # a call's files
    enginethread)  # the engine alone at 64 clients on the main thread and on a thread of its own, in turns, with
      # default torch threads and with OMP_NUM_THREADS=1 (random weights of the default model, k = 0, no stack)
      random_model
      for omp in default 1; do
        if [ "$omp" = 1 ]; then export OMP_NUM_THREADS=1; else unset OMP_NUM_THREADS; fi
        TAIL=8 LIMIT=200 stack . "enginethread_omp_$omp" --model /tmp/models/smollm2-135m --no-stack --engine-on both \
          --clients 64 --ks 0 --num-requests 600 --passes 2
      done; unset OMP_NUM_THREADS ;;
    interval)  # --stream-interval 1 against 8: the real weights, 64 and 256 clients, k = 0, stack (the engine alone
      default_model || continue  # once, beside interval 1)
      for n in 1 8; do
        engine=--no-engine; [ "$n" = 1 ] && engine=
        TAIL=6 LIMIT=200 stack . "interval_$n" --clients 64 256 --ks 0 --num-requests 600 $engine -- --stream-interval "$n"
      done ;;
    model) default_model ;;
    stack_new|stack_old)
      default_model || continue
      if [ "$part" = stack_new ]; then tree=. offset=800; else tree=.device/old offset=900; fi
      offset=${PORT_OFFSET:-$offset}
      LIMIT=${STACK_LIMIT:-420} stack "$tree" "$part" --clients $CLIENTS --ks 0 4 --num-requests "$REQUESTS" --no-engine \
        --port-offset "$offset" ;;
    stack_engine) default_model || continue
      LIMIT=${STACK_LIMIT:-540} stack . stack_engine --clients $CLIENTS --ks 0 4 --num-requests "$REQUESTS" ;;
    engine_new) bash tools/device_run.sh latency1 throughput ;;
    engine_old) bash tools/device_run.sh before throughput_before ;;
    engine_throughput) bash tools/device_run.sh throughput ;;
    ttft) default_model || continue
      LIMIT=${STACK_LIMIT:-300} stack . ttft --clients 1 16 --ks 0 4 --num-requests 64 --batch1-requests 24 --no-engine ;;
    piecetests) python3 -m pytest -q -p no:cacheprovider tests/gpu/test_piecewise_graphs.py \
        tests/gpu/test_graphs_and_engine.py 2>&1 | tee "$OUT/piecetests.log" | tail -15 ;;
    soak) default_model || continue  # 64 clients for SOAK_S seconds: the drafter killed, then a verifier restarted
      SPECD_DEFAULT_GGUF=/tmp/gguf/model.gguf timeout "${LIMIT:-560}" "${SOAK[@]}" --duration "${SOAK_S:-420}" \
        --json "$OUT/soak.json" > "$OUT/soak.log" 2>&1
      echo "== soak (exit $?)"; tail -n 20 "$OUT/soak.log" ;;
    gputests) default_model || continue  # the real weights' tests skip unless the variable names the converted GGUF
      SPECD_DEFAULT_GGUF=/tmp/gguf/model.gguf timeout "${LIMIT:-540}" bash tools/device_run.sh tests ;;
    kernels) trace_kernels ;;
    timeline | timeline_real)  # the engine's loop at one request, k = 0 / 4: a step's time beyond its kernels
      if [ "$part" = timeline ]; then random_model; model=/tmp/models/smollm2-135m; else
        default_model || continue; model=default; fi
      SPECD_DEFAULT_GGUF=/tmp/gguf/model.gguf timeout 300 python3 -m bench.step_timeline --model "$model" \
        --device cuda --ks 0 4 --batch 1 ${TIMELINE_BATCH:-} --steps 300 --out "$OUT/$part.json" > "$OUT/$part.log" 2>&1
      echo "== $part"; grep -v Warning "$OUT/$part.log" | tail -n 24 ;;
    fewrows)  # `timeline` with SPECD_FEW_ROW_GEMMS=each of FEWROWS (triton), then FEWROWS_BASE (cublas), random weights
      # shellcheck disable=SC2086
      timelines_under fewrows SPECD_FEW_ROW_GEMMS ${FEWROWS:-triton} ${FEWROWS_BASE-cublas} ;;
    maxrows)  # the Triton GEMM's row limit, one engine build each, at 1 and 16 requests (random weights)
      # shellcheck disable=SC2086
      TIMELINE_ARGS="--batch 1 16" timelines_under maxrows SPECD_FEW_ROW_GEMMS_MAX_ROWS ${MAXROWS:-128 64} ;;
    gemmrows)  # bench.few_rows_gemm: a step's projections by row count, cuBLAS against the Triton GEMM (random weights)
      random_model
      timeout 200 python3 -m bench.few_rows_gemm --model /tmp/models/smollm2-135m ${GEMMROWS_ARGS:-} > "$OUT/gemmrows.log" 2>&1
      echo "== gemmrows (exit $?)"; tail -n 20 "$OUT/gemmrows.log" ;;
    fewrows_stack) default_model || continue
      for kind in ${FEWROWS:-triton} ${FEWROWS_BASE-cublas}; do
        SPECD_FEW_ROW_GEMMS=$kind LIMIT=${FEWROWS_LIMIT:-220} stack . "fewrows_stack_$kind" --clients 1 16 --ks 0 4 \
          --num-requests 128 --batch1-requests 24 --no-engine
      done ;;
    envs_stack) default_model || continue  # the real weights through the stack once under each assignment of
      i=0  # ENVS (e.g. "SPECD_FEW_ROW_GEMMS_MAX_ROWS=128 SPECD_FEW_ROW_GEMMS_MAX_ROWS=64"), at ENVS_CLIENTS (1 16),
      for assignment in ${ENVS:?}; do  # k = 0 and 4, memory off, stack only
        i=$((i + 1)); echo "== run $i: $assignment"
        # shellcheck disable=SC2086
        (export "${assignment?}"; LIMIT=${ENVS_LIMIT:-200} stack . "envs_$i" --clients ${ENVS_CLIENTS:-1 16} --ks 0 4 \
          --num-requests ${ENVS_REQUESTS:-256} --batch1-requests ${ENVS_BATCH1:-32} --no-engine)
      done ;;
    splitk)  # `timeline` with the Triton GEMM's K split (SPECD_FEW_ROW_GEMMS_SPLIT_K=1), then whole (0), random weights
      # shellcheck disable=SC2086
      timelines_under splitk SPECD_FEW_ROW_GEMMS_SPLIT_K ${SPLITK:-1 0} ;;
    lineartests)  # the Triton GEMM's tests and the deterministic mode's kernel tests (no weights needed)
      timeout "${LIMIT:-300}" python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_triton_linear.py \
        "tests/gpu/test_deterministic_cuda.py::test_linear_rows_do_not_depend_on_the_rows_beside_them" \
        > "$OUT/lineartests.log" 2>&1
      echo "== lineartests (exit $?)"; tail -n 15 "$OUT/lineartests.log" ;;
    drafters) default_model || continue  # the link against in-process drafting through the stack, in turns
      i=0 engine=""
      for drafter in ${DRAFTERS_ORDER:-link in-process in-process link}; do
        i=$((i + 1)) args=""; [ "$drafter" = in-process ] && args="-- --drafter-addr in-process"
        # shellcheck disable=SC2086
        LIMIT=${DRAFTERS_LIMIT:-150} stack . "drafters_${i}_$drafter" --clients ${DRAFTERS_CLIENTS:-16} --ks 0 4 \
          --num-requests ${DRAFTERS_REQUESTS:-384} $engine $args
        engine=--no-engine
      done ;;
    linkab)  # what the drafter link's 0.14-0.24 ms a step is (round 46)
      model=""
      if [ "${LINKAB_MODEL:-real}" = random ]; then random_model; model="--model /tmp/models/smollm2-135m"
      else default_model || continue; fi
      i=0 limit=240 runs=${LINKAB_RUNS:-link:.,link:probe8,in-process:.,link:probe8,link:.}
      for run in ${runs//,/ }; do
        i=$((i + 1)) drafter=${run%%:*} name=${run#*:} args=""
        [ "$drafter" = in-process ] && args="-- --drafter-addr in-process"
        run_as "$name" || continue
        # shellcheck disable=SC2086
        SPECD_DRAFTER_PROBE_STEPS=$probe_steps PROFILER=$profiler LIMIT=$limit TAIL=3 stack "$tree" "linkab_${i}_${drafter}_${name//\//_}" \
          $model --clients 16 --ks ${LINKAB_KS:-4} --num-requests 384 --no-engine $args
        limit=180
      done ;;
    wakecost) python3 tools/wake_cost.py --seconds 3 | tee "$OUT/wakecost.txt" ;;  # the engine thread's wake-ups
    pinab)  # the stack at 64 and 256 clients, k = 0: this tree against pin, in turns (round 46)
      random_model
      i=0 engine="" limit=280 runs=${PINAB_RUNS:-.,pin,.}
      for name in ${runs//,/ }; do
        i=$((i + 1))
        run_as "$name" || continue
        [ "$name" = . ] && name=this
        # shellcheck disable=SC2086
        SPECD_DRAFTER_PROBE_STEPS=$probe_steps PROFILER=$profiler LIMIT=$limit TAIL=4 stack "$tree" "pinab_${i}_$name" \
          --model /tmp/models/smollm2-135m --clients 64 256 --ks 0 --num-requests 512 $engine
        engine=--no-engine limit=140
      done ;;
    linkprof) default_model || continue  # the drafter link against in-process drafting, under py-spy and the sampler
      python3 tools/thread_sched.py "$OUT/linkprof_sched.jsonl" --interval 0.5 --duration 400 & sampler=$!
      for drafter in link in-process; do
        args=""; [ "$drafter" = in-process ] && args="-- --drafter-addr in-process"
        echo "$drafter $(date +%s.%N)" >> "$OUT/linkprof_marks.txt"
        # shellcheck disable=SC2086
        pyspy_stack "linkprof_$drafter" --clients 16 --ks 4 --num-requests 384 --no-engine $args
      done
      echo "end $(date +%s.%N)" >> "$OUT/linkprof_marks.txt"; kill "$sampler" ;;
    stalls) default_model || continue  # 1,000 requests a client count: 500 prompts twice, memory on, k = 4
      LIMIT=${STACK_LIMIT:-400} stack . stalls --clients 1 16 --ks 4 --batch1-requests 500 --num-requests 500 \
        --passes 2 --draft-memory-scope global --no-engine
      echo "== slow steps logged: $(grep -c 'slow engine step' "$OUT/stalls.stack.log")"
      grep 'slow engine step' "$OUT/stalls.stack.log" | head -n 8 ;;
    verifycost) default_model || continue  # the mean step at k = 0 and k = 4, one client, memory off
      LIMIT=${STACK_LIMIT:-240} stack . verifycost --clients 1 --ks 0 4 --batch1-requests 48 --passes 2 --no-engine ;;
    soak_bg) default_model || continue  # the soak in a session of its own, outliving this call (soak_wait collects)
      mkdir -p /tmp/soak
      SPECD_DEFAULT_GGUF=/tmp/gguf/model.gguf setsid nohup "${SOAK[@]}" --duration "${SOAK_S:-600}" \
        --json /tmp/soak/soak.json > /tmp/soak/soak.log 2>&1 < /dev/null &
      echo $! > /tmp/soak/pid; echo "== soak started at $(date +%T)" ;;
    soak_wait)  # until the soak of soak_bg ends (or LIMIT s pass): its log and report
      # (its pid, not pgrep -f: the call's own command line may name the bench)
      while kill -0 "$(cat /tmp/soak/pid)" 2> /dev/null && [ "$SECONDS" -lt "${LIMIT:-560}" ]; do sleep 5; done
      cp /tmp/soak/soak.log "$OUT/"; [ -f /tmp/soak/soak.json ] && cp /tmp/soak/soak.json "$OUT/"
      echo "== soak $(kill -0 "$(cat /tmp/soak/pid)" 2> /dev/null && echo 'still running' || echo ended) at $(date +%T)"
      tail -n 25 /tmp/soak/soak.log ;;
    setup) echo "set up; GGUF piece 1 kept: $(ls -la /tmp/gguf.part1)"; lscpu > "$OUT/lscpu.txt" ;;
    detkernels)  # the deterministic mode's kernels alone (no model): a row's bits in any step
      python3 -m pytest -q -p no:cacheprovider tests/gpu/test_deterministic_cuda.py -k "linear or rms_norm or attention or fused or split or rope" \
        2>&1 | tee "$OUT/detkernels.log" | tail -8 ;;
    dettests) default_model || continue  # the deterministic mode on the default model through the engine
      SPECD_DEFAULT_GGUF=/tmp/gguf/model.gguf timeout "${LIMIT:-400}" python3 -m pytest -q -p no:cacheprovider -rs \
        tests/gpu/test_deterministic_cuda.py 2>&1 | tee "$OUT/dettests.log" | tail -15 ;;
    defaulttest) default_model || continue  # the default mode's greedy text with and without drafts (near-ties)
      SPECD_DEFAULT_GGUF=/tmp/gguf/model.gguf timeout 300 python3 -m pytest -q -s -p no:cacheprovider \
        tests/gpu/test_default_model.py 2>&1 | tee "$OUT/defaulttest.log" | grep -E "prompt|identical|passed|failed" ;;
    detbench) default_model || continue  # bench.deterministic: the default model's real weights
      SPECD_DEFAULT_GGUF=/tmp/gguf/model.gguf timeout "${LIMIT:-400}" python3 -m bench.deterministic \
        --out "$OUT/detbench.json" > "$OUT/detbench.log" 2>&1
      echo "== detbench (exit $?)"; tail -n 7 "$OUT/detbench.log" ;;
    detbench_8b|detbench_135m)  # bench.deterministic: Qwen3-8B's / the default model's shapes, random weights,
      # the default model's tokenizer (.device/qwen3-8b-det, .device/smollm2-135m-det: config.json only, tools/device_prepare.sh)
      dir=$(det_model "${part#detbench_}")
      # shellcheck disable=SC2086  # DET_ARGS: more bench.deterministic arguments
      timeout "${LIMIT:-400}" python3 -m bench.deterministic --model "$dir" --random-weights ${DET_ARGS:-} \
        --out "$OUT/$part.json" > "$OUT/$part.log" 2>&1
      echo "== $part (exit $?)"; tail -n 7 "$OUT/$part.log" ;;
    detgemms)  # bench.deterministic on the default model's shapes (random weights): the default mode and the
      # deterministic one under each SPECD_DETERMINISTIC_GEMMS of DET_GEMMS (cublas triton triton-split), one process each
      dir=$(det_model "${DET_SHAPES:-135m}")  # DET_SHAPES=8b: Qwen3-8B's shapes
      modes="default deterministic"
      for gemms in ${DET_GEMMS:-cublas triton triton-split}; do
        # shellcheck disable=SC2086
        SPECD_DETERMINISTIC_GEMMS=$gemms timeout "${LIMIT:-200}" python3 -m bench.deterministic --model "$dir" \
          --random-weights --modes $modes ${DET_ARGS:-} --out "$OUT/detgemms${DET_SHAPES:-}_$gemms.json" \
          > "$OUT/detgemms${DET_SHAPES:-}_$gemms.log" 2>&1
        echo "== detgemms ${DET_SHAPES:-} $gemms (exit $?)"; tail -n 7 "$OUT/detgemms${DET_SHAPES:-}_$gemms.log"
        modes=deterministic
      done ;;
    detab)  # bench.deterministic for each NAME:TREE of DETAB_TREES in turn, the first in both modes, the rest in the
      # deterministic mode alone (one process each)
      dir=$PWD/$(det_model 135m) modes="default deterministic" DETAB_TREES=${DETAB_TREES:-new:.,old:.device/old,new2:.}
      for run in ${DETAB_TREES//,/ }; do  # NAME:TREE,... (commas: a lane spec splits on spaces)
        name=${run%%:*} tree=$(cd "${run#*:}" && pwd)
        # shellcheck disable=SC2086  # modes, DET_ARGS: words
        (cd /tmp/bench-root && PYTHONPATH=/tmp/site:$tree timeout "${LIMIT:-200}" python3 -m bench.deterministic \
          --model "$dir" --random-weights --modes $modes ${DET_ARGS:-} --out "$OUT/detab_$name.json") \
          > "$OUT/detab_$name.log" 2>&1
        echo "== detab $name (exit $?)"; tail -n 7 "$OUT/detab_$name.log"
        modes=deterministic
      done ;;
    dettrace)  # one batch-1 decode and verify step's kernels (graph replays), default mode then deterministic
      random_model
      for mode in "" --deterministic; do
        timeout 200 python3 -m bench.profile_step /tmp/models/smollm2-135m --trace --graph $mode > "$OUT/trace$mode.log" 2>&1
        echo "== trace $mode"; grep "kernels per step" "$OUT/trace$mode.log"
      done ;;
    prefill)
      random_model
      timeout 400 python3 -m bench.profile_step /tmp/models/smollm2-135m --prefill > "$OUT/prefill.log" 2>&1
      echo "== prefill"; grep -v "Warning\|warn" "$OUT/prefill.log" | tail -n 45 ;;
    real|old_real)
      tree=.; [ "$part" = old_real ] && tree=.device/old
      default_model || continue
      stack "$tree" "${part}_nomemory" --clients 1 16 64 --ks 0 4 --num-requests 128
      stack "$tree" "${part}_memory" --clients 1 --ks 4 --passes 2 --draft-memory-scope global --port-offset 900 ;;
    *) echo "unknown part $part" ;;
  esac
done
