"""Builds the drafter's native sequence store (drafter_service/native_store.cpp and the headers in
drafter_service/native/); the rest is pyproject.toml.

`pip install -e .` (make install / install-test) compiles it; without it the drafter runs the Python
reference store (drafter_service/stores.py chooses), e.g. when the code runs from PYTHONPATH.
"""
from glob import glob

from pybind11.setup_helpers import Pybind11Extension
from setuptools import setup

# -ffp-contract=off: the drafting rule's arithmetic must round as the Python reference's does (no fused
# multiply-adds), so that both draft alike (tests/drafter/test_native_store.py).
setup(ext_modules=[
    Pybind11Extension("drafter_service._native_store", ["drafter_service/native_store.cpp"],
                      depends=glob("drafter_service/native/*.h"), cxx_std=17,
                      extra_compile_args=["-O3", "-ffp-contract=off"]),
])
