"""Builds the drafter's native sequence store (drafter_service/native_store.cpp); the rest is pyproject.toml.

`pip install -e .` (make install / install-test) compiles it; without it the drafter runs the Python
reference store (drafter_service/stores.py chooses), e.g. when the code runs from PYTHONPATH.
"""
from pybind11.setup_helpers import Pybind11Extension
from setuptools import setup

setup(ext_modules=[
    Pybind11Extension("drafter_service._native_store", ["drafter_service/native_store.cpp"],
                      cxx_std=17, extra_compile_args=["-O3"]),
])
