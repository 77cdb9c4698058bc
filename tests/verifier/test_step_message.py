"""A step's outputs cross the engine process's pipe as columns (verifier_service/step_message.py) and come out as
the same outputs: every field, in order, still frozen, failures after them; and the columns pickle smaller."""
import dataclasses
import pickle

import pytest

from verifier_service.engine.outputs import FinishReason, RequestOutput, RequestUsage, TokenLogprobs
from verifier_service.output_router import EngineUnavailable, RequestFailed
from verifier_service.step_message import pack, unpack


def output(index: int, **fields) -> RequestOutput:
    usage = RequestUsage(100 + index, 20, 8, 5, 17, 4)
    return RequestOutput(f"req-{index}", [index, index + 1], None, usage, **fields)


def roundtrip(items):
    return unpack(pickle.loads(pickle.dumps(pack(items), protocol=pickle.HIGHEST_PROTOCOL)))


def test_outputs_come_out_equal_with_every_field_in_order_and_failures_last():
    logprobs = [TokenLogprobs(7, -0.25, ((7, -0.25), (3, -1.5))), TokenLogprobs(8, -0.5, ())]
    failed = RequestFailed("req-bad", EngineUnavailable("the engine process exited with code 9"))
    items = [output(0), failed, output(1, logprobs=logprobs, seed=42),
             dataclasses.replace(output(2), finish_reason=FinishReason.STOP),
             RequestOutput("req-3", [], FinishReason.ABORT, RequestUsage(9, 0, 0, 0, 0))]
    received = roundtrip(items)
    assert received[:4] == [items[0], *items[2:]]
    assert [type(item) for item in received] == [RequestOutput] * 4 + [RequestFailed]
    assert received[4].request_id == "req-bad" and str(received[4].error) == str(failed.error)
    assert received[1].logprobs == logprobs and received[1].seed == 42 and received[1].usage.steps == 17
    assert received[2].finished and received[2].finish_reason is FinishReason.STOP
    with pytest.raises(dataclasses.FrozenInstanceError):
        received[0].new_token_ids = []
    with pytest.raises(dataclasses.FrozenInstanceError):
        received[0].usage.steps = 0
    assert roundtrip([]) == []


def test_a_step_of_256_outputs_pickles_in_fewer_bytes_as_columns():
    outputs = [output(index) for index in range(256)]
    as_objects = len(pickle.dumps(outputs, protocol=pickle.HIGHEST_PROTOCOL))
    as_columns = len(pickle.dumps(pack(outputs), protocol=pickle.HIGHEST_PROTOCOL))
    assert as_columns < 0.7 * as_objects
    assert roundtrip(outputs) == outputs
