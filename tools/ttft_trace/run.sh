#!/usr/bin/env bash
# Where a first token's time goes: the stack with hooks.patch applied (timestamps at fourteen points of a request's
# path, CLOCK_MONOTONIC, which every process shares) in a copy of this tree, 40 instruction prompts sent one at a
# time as streaming chat completions of 4 tokens, then the median time of each hop (docs/BENCHMARKS.md, round 24).
#   bash tools/ttft_trace/run.sh                      # on a GPU machine set up by tools/device_run.sh: random weights
#   DEV=cpu MODEL=/tmp/models/smollm2-tiny PY=.venv/bin/python bash tools/ttft_trace/run.sh
# (python -m bench.make_random_model smollm2-tiny /tmp/models/smollm2-tiny makes the CPU's model.)
set -u
OUT=${OUT:-/tmp/out}; DEV=${DEV:-cuda}; MODEL=${MODEL:-/tmp/models/smollm2-135m}; PY=${PY:-python3}
here=$PWD tree=/tmp/ttft-tree
if [ "$DEV" = cuda ]; then
  bash tools/device_run.sh >/dev/null || exit 1  # its set-up alone: the wheels, the drafter's native store
  [ -d "$MODEL" ] || PYTHONPATH=/tmp/site:$here python3 -m bench.make_random_model smollm2-135m "$MODEL" .device/model >/dev/null
fi
rm -rf "$tree" && mkdir -p "$tree" && cp -r bench drafter_service gateway specd specd_cli verifier_service "$tree"/
(cd "$tree" && patch -s -p1 <"$here/tools/ttft_trace/hooks.patch") || exit 1
site=""; [ "$DEV" = cuda ] && site=/tmp/site:
export PYTHONPATH=$site$tree PYTHONUNBUFFERED=1
mkdir -p /tmp/trace "$OUT" && rm -f /tmp/trace/*
(cd "$tree" && exec $PY -m specd_cli up --model "$MODEL" --device "$DEV" --port-offset 700 --host 127.0.0.1) >"$OUT/up.log" 2>&1 &
up=$!
for i in $(seq 300); do grep -q "specd: ready" "$OUT/up.log" && break; sleep 1; done
echo "ready after $i s"
rm -f /tmp/trace/*
$PY "$here/tools/ttft_trace/client.py" 8700 | tee "$OUT/client.txt"
cat /tmp/trace/*.log | sort -n >"$OUT/trace.log"
$PY "$here/tools/ttft_trace/analyze.py" "$OUT/trace.log" | tee "$OUT/hops.txt"
kill -INT "$up"; wait "$up"
