"""Host values to a device tensor without making the host wait: pinned memory and a non-blocking copy on CUDA.

A plain `.to("cuda")` from pageable memory synchronizes with the device, which would cost every verifier
step a host sync; every per-step input built from Python lists goes through `to_device`.
"""
from __future__ import annotations

import torch


def to_device(values, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """torch.tensor(values, dtype) on `device`; on CUDA staged in pinned memory and copied without blocking."""
    device = torch.device(device)
    pinned = device.type == "cuda"
    return torch.tensor(values, dtype=dtype, pin_memory=pinned).to(device, non_blocking=pinned)
