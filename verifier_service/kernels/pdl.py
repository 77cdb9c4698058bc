"""Programmatic dependent launch (PDL): a step's next kernel starts while the one before it finishes.

A batch-1 decode step is ~10 kernels a layer, most of them a few microseconds long, and between two of them the
GPU idles while the next kernel launches. On Hopper and later a kernel launched with PDL may start as soon as
every program of the kernel before it has said so (`gdc_launch_dependents`); it then waits (`gdc_wait`) until that
kernel has finished and its writes are visible, before it reads or writes anything. Its launch, and the programs'
start, overlap the previous kernel's tail. CUDA graphs keep these edges.

Every kernel of ours that takes part waits first, then lets its dependents launch, then runs (triton_pdl.prologue):
so when any kernel starts, every kernel two launches back has finished, and it needs only the one right before
it, which it waits for. Inductor's own kernels (`triton.enable_pdl`: model/compile.py) wait before they first touch
what the kernel before them wrote, and let their dependents launch only after that wait, so the same holds for
them. Kernels launched without PDL (cuBLAS, NCCL, flash-attn, copies) keep the plain stream order on both sides.

On by default on CUDA devices of compute capability 9 and up; SPECD_PDL=0 (read when a device is first
asked about) turns it off, to measure before / after.
"""
from __future__ import annotations

import functools

import torch

from specd import environment


@functools.cache
def enabled(device: torch.device) -> bool:
    """Whether kernels on `device` (a tensor's device) launch with PDL: a CUDA device of compute capability >= 9,
    SPECD_PDL not "0". Decided once per device and process: our kernels ask at every launch, eager steps included."""
    if device.type != "cuda" or not environment.pdl():
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9
