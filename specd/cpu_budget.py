"""How many CPUs this process may use: its affinity mask, capped by a cgroup CPU quota (a container's CPU limit)."""
from __future__ import annotations

import math
import os
from pathlib import Path

_CGROUP_V2_MAX = Path("/sys/fs/cgroup/cpu.max")


def usable_cpus() -> int:
    """At least 1."""
    cpus = len(os.sched_getaffinity(0))
    try:
        quota, period = _CGROUP_V2_MAX.read_text().split()
        if quota != "max":
            cpus = min(cpus, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    return max(1, cpus)
