#!/usr/bin/env bash
# Times this checkout's `make serve` until the stack prints `specd: ready`, then stops it (SIGINT, as Ctrl-C)
# and checks that it stopped cleanly. On a fresh clone this is README's set-up figure; .ci/run prints it in
# every CI log. Usage: tools/time_to_ready.sh [LIMIT_SECONDS]   (default 600)
#   git clone <repo> /tmp/fresh && /tmp/fresh/tools/time_to_ready.sh     # a fresh clone, as a newcomer has
set -uo pipefail
cd "$(dirname "$0")/.."
limit=${1:-600}
log=$(mktemp /tmp/specd-time-to-ready.XXXX.log)
began=$(date +%s.%N)
setsid make serve >"$log" 2>&1 &
pid=$!
ready=""
while kill -0 "$pid" 2>/dev/null; do
  if grep -q "^specd: ready" "$log"; then ready=$(date +%s.%N); break; fi
  if (( $(date +%s) - ${began%.*} > limit )); then break; fi
  sleep 0.5
done
if [ -z "$ready" ]; then
  echo "time to ready: no 'specd: ready' within $limit s; the log's tail:"; tail -n 40 "$log"
  kill -TERM -- "-$pid" 2>/dev/null; wait "$pid"; exit 1
fi
printf 'time to ready: %.0f s (make serve from this checkout to specd: ready; %s, %s cores)\n' \
  "$(echo "$ready - $began" | bc)" "$(date -u +%F)" "$(nproc)"
kill -INT -- "-$pid"  # the whole group, as a terminal's Ctrl-C reaches make and specd
wait "$pid"
code=$?
specd_line=$(grep -E "^specd: (unclean|.* exited)" "$log" || true)
if [ -n "$specd_line" ]; then echo "time to ready: the stack did not stop cleanly: $specd_line"; exit 1; fi
echo "time to ready: stopped (make's exit code $code)"
