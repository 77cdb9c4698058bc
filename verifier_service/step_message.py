"""One engine step's outputs as columns for the engine process's pipe (engine_process.py).

The engine thread pickles every step's outputs before its next step: a list of RequestOutput dataclasses pickles as
a class, a state dict and a nested RequestUsage per request, about 3 us each on the development machine (0.74 ms a
step at 256 requests). The same values as six plain lists pickle in under a third of that (tools/step_message_cost.py).
The serving process rebuilds the objects as unpickling them did (object.__new__ and the state dict, no __init__), at
about the same cost. RequestFailed items (a failed add or step: rare) travel as they are, after the outputs.
"""
from __future__ import annotations

import dataclasses
from operator import attrgetter

from verifier_service.engine.outputs import RequestOutput, RequestUsage
from verifier_service.output_router import RequestFailed

USAGE_FIELDS = tuple(field.name for field in dataclasses.fields(RequestUsage))
_usage_values = attrgetter(*USAGE_FIELDS)

Packed = tuple[list, list, list, list, list, list, list[RequestFailed]]


def pack(items: list[RequestOutput | RequestFailed]) -> Packed:
    """A step's items -> (request ids, new token ids, finish reasons, usage tuples, logprobs, seeds, failures)."""
    outputs = [item for item in items if type(item) is RequestOutput]
    failed = [item for item in items if type(item) is not RequestOutput]
    return ([o.request_id for o in outputs], [o.new_token_ids for o in outputs], [o.finish_reason for o in outputs],
            [_usage_values(o.usage) for o in outputs], [o.logprobs for o in outputs], [o.seed for o in outputs],
            failed)


def unpack(packed: Packed) -> list[RequestOutput | RequestFailed]:
    """pack's columns -> the step's items: its outputs in order, then its failures."""
    *columns, failed = packed
    items: list[RequestOutput | RequestFailed] = []
    for request_id, token_ids, finish_reason, usage, logprobs, seed in zip(*columns):
        usage = _frozen(RequestUsage, dict(zip(USAGE_FIELDS, usage)))
        items.append(_frozen(RequestOutput, {"request_id": request_id, "new_token_ids": token_ids,
                                             "finish_reason": finish_reason, "usage": usage, "logprobs": logprobs,
                                             "seed": seed}))
    return items + failed


def _frozen(cls, state: dict):
    """A frozen dataclass instance from its fields' values, built as unpickling builds one."""
    instance = object.__new__(cls)
    object.__setattr__(instance, "__dict__", state)
    return instance
