"""The device side of programmatic dependent launch (pdl.py): what our Triton kernels run first.

Importing this module needs triton; the kernels that call `prologue` import it beside their own triton code.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def prologue(PDL: tl.constexpr):
    """With PDL: wait until the kernel launched before this one has finished (its writes visible), then let the
    kernel after this one launch. Call it before the kernel's first load or store of anything another kernel
    writes; a kernel launched with launch_pdl=PDL."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
