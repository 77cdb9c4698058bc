#!/usr/bin/env bash
# One device call: lanes of tools/device_run.sh parts side by side, each lane on its own GPUs and its parts one after
# another, all within LIMIT seconds; then everything the parts wrote is packed into $OUT/all.tgz (the device tool
# brings back at most 8 files) and their tables are printed.
#   LIMIT=540 bash tools/device_call.sh "0,1 FRESH_COMPILE=1 tptests" "2 latency1 throughput"
# A lane is "DEVICES [VAR=VALUE | PART]...": a VAR=VALUE applies to the lane's later parts, its commas read as spaces
# (a lane splits at spaces, so a list is SPEC_CLIENTS=64,256; the settings that take commas read them so). Lane n
# writes to $OUT/lane<n>. Past LIMIT every lane is killed (its part's log says how far it got), so the archive still
# comes back.
set -u
OUT=${OUT:-/tmp/out} LIMIT=${LIMIT:-540} RUN=${DEVICE_RUN:-tools/device_run.sh}
mkdir -p "$OUT"
bash "$RUN" >/dev/null 2>&1  # installs once, before the lanes start side by side

lane() {  # lane N DEVICES TOKEN...
  local n=$1 devices=$2 env=(); shift 2
  mkdir -p "$OUT/lane$n"
  for token in "$@"; do
    case $token in
      *=*) env+=("${token//,/ }") ;;
      *) echo "== lane $n ($devices): $token"
         env "${env[@]}" CUDA_VISIBLE_DEVICES="$devices" OUT="$OUT/lane$n" bash "$RUN" "$token" ;;
    esac
  done
}

lanes=() n=0
for spec in "$@"; do
  n=$((n + 1))
  # shellcheck disable=SC2086  # a lane's words are its devices, settings and parts
  setsid bash -c "$(declare -f lane); OUT='$OUT' RUN='$RUN'; lane $n $spec" >"$OUT/lane$n.log" 2>&1 &
  lanes+=($!)
done
alive() { for pid in "${lanes[@]}"; do kill -0 "$pid" 2>/dev/null && return 0; done; return 1; }
deadline=$((SECONDS + LIMIT))
while [ $SECONDS -lt $deadline ] && alive; do sleep 2; done
for pid in "${lanes[@]}"; do
  kill -0 "$pid" 2>/dev/null || continue
  echo "device_call: lane of pid $pid killed at the ${LIMIT} s limit"; kill -KILL -- "-$pid"
done 2>/dev/null >"$OUT/limit.log"
cd "$OUT" && tar czf /tmp/all.tgz . && find . -mindepth 1 -delete && mv /tmp/all.tgz all.tgz
tables="^== lane|exit code|differ|passed|failed|^\\| |killed"
tar xzf all.tgz -O --wildcards './lane*.log' ./limit.log 2>/dev/null | grep -E "$tables" | cut -c1-300 | tee summary.txt
