"""The host's reference for a step that continues from one in flight: the batch with the real tokens and starts,
read from the previous step's result (which waits for it). The engine never waits so: previous_tokens.py feeds and
advances such steps on the device, and the tests compare what it builds with this."""
from __future__ import annotations

import copy

from verifier_service.engine.batch import ScheduledBatch


def resolve_on_host(batch: ScheduledBatch) -> ScheduledBatch:
    """A copy of batch whose continuing entries carry the real token and start."""
    if batch.previous_result is None:
        return batch
    result = batch.previous_result.tolist()
    requests = []
    for request in batch.requests:
        if request.previous_token_row >= 0:
            request = copy.copy(request)
            request.token_ids = list(request.token_ids)
            request.resolve_previous(*result[request.previous_token_row])
        requests.append(request)
    return ScheduledBatch(requests)
