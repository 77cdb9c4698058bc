"""Start-up's Python objects, frozen out of the garbage collector's way once the warm-up is done (the verifier,
every rank of a tensor-parallel one, and the GPU benches before they time anything)."""
from __future__ import annotations

import gc


def freeze() -> int:
    """After the warm-up: the Python objects start-up made, frozen out of the collector's way; how many. Loading,
    compiling and capturing leave millions of long-lived objects (torch.compile's caches among them). Frozen, full
    collections stop walking them: a collection pause inside a step is time the GPU waits for the host (under
    async scheduling; under tensor parallelism every other rank waits too, at the step's first all-reduce)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
