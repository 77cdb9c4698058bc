#!/usr/bin/env bash
# Builds the drafter's native sequence store (setup.py) in each source tree given (default: this one), as
# `pip install` builds it, from the setuptools and pybind11 wheels in .device/build/ (the GPU machine has no
# package index). Trees already built are skipped; without the wheels nothing is built, and the drafter (and the
# benches' in-process proposer) run the Python reference store.
#   bash tools/build_native_store.sh [TREE...]
ls .device/build/*.whl >/dev/null 2>&1 || exit 0
for tree in "${@:-.}"; do
  [ -d "$tree/drafter_service" ] || continue
  ls "$tree"/drafter_service/_native_store*.so >/dev/null 2>&1 && continue
  [ -d /tmp/build-site ] || python3 -m pip install -q --no-index --no-deps --target /tmp/build-site .device/build/*.whl || exit 1
  (cd "$tree" && PYTHONPATH=/tmp/build-site python3 setup.py -q build_ext --inplace >/tmp/native_store.log 2>&1) ||
    tail -5 /tmp/native_store.log
done
