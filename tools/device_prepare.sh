#!/usr/bin/env bash
# Fills the git-ignored folders a device call carries (tools/device_call.sh, carry [".device"] then, in the next call,
# [".device-part2"]): the GPU image's missing wheels, the device kit's flash-attn wheel and peers, the default model's
# tokenizer (.device/model), config-only checkpoints for bench.deterministic's random weights, and the default model's
# GGUF in two pieces (over one call's 64 MiB carry), the setuptools and pybind11 wheels that
# tools/build_native_store.sh builds the drafter's native store with there (.device/build), and py-spy's
# (.device/tools: tools/device_stack.sh's pyspy parts).
#   bash tools/device_prepare.sh KIT_DIR     # KIT_DIR: the device kit (flash-attn wheel, peers/)
set -euo pipefail
kit=${1:?the device kit folder (flash-attn wheel, peers/)}
py=${PYTHON:-.venv/bin/python}
mkdir -p .device .device-part2
cp "$kit"/flash_attn-*.whl .device/
rm -rf .device/peers && cp -r "$kit/peers" .device/peers
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .device \
  grpcio-health-checking==1.84.0 grpcio-reflection==1.84.0 fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 \
  pydantic-core==2.50.5 annotated-types annotated-doc typing-inspection sniffio anyio uvicorn h11 httptools click \
  opentelemetry-api==1.45.2 gguf==0.19.0
"$py" -m pip download -q --no-deps --only-binary=:all: -d .device/build setuptools pybind11
"$py" -m pip download -q --no-deps --only-binary=:all: --platform manylinux1_x86_64 -d .device/tools py-spy==0.4.3
model=$("$py" -c "from specd.default_model import ensure_default_model; print(ensure_default_model())")
gguf=${SPECD_HOME:-$HOME/.cache/specd}/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
tokenizer=(tokenizer.json tokenizer_config.json chat_template.jinja generation_config.json)
mkdir -p .device/model && for f in "${tokenizer[@]}" config.json; do cp "$model/$f" .device/model/; done
for preset in qwen3-8b smollm2-135m; do  # config.json only: tools/device_stack.sh adds .device/model's tokenizer there
  "$py" -c "import sys; from bench.make_random_model import PRESETS; PRESETS[sys.argv[1]]().save_pretrained(sys.argv[2])" \
    "$preset" ".device/$preset-det"
done
# The second piece is the larger (60 MB): a call's 64 MiB carry holds the tree too, and the first call's .device the
# wheels, the peers and a tree measured against (.device/old) beside its piece.
head -c 38000000 "$gguf" > .device/gguf.part1
tail -c +38000001 "$gguf" > .device-part2/gguf.part2
du -sh .device .device-part2
