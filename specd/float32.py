"""A Python float as the float32 the verifier samples with (shared by the gateway's and the verifier's checks)."""
from __future__ import annotations

import struct


def as_float32(value: float) -> float:
    """`value` rounded to float32: 1e-46 becomes 0.0, and anything beyond float32's range inf."""
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        return float("inf")
