"""The verifier's reading of a request: an unset field takes its default, a set one is checked as sent
(0 never stands for "unset" or "off"), in the float32 precision it is sampled with."""
import pytest

from specd.v1 import common_pb2
from verifier_service.convert import ModelLimits, output_to_proto, sampling_from_proto
from verifier_service.engine.outputs import RequestOutput, RequestUsage, TokenLogprobs
from verifier_service.engine.sampling_params import InvalidParameter, SamplingParams

LIMITS = ModelLimits(name="m", max_model_len=64, vocab_size=100)


def test_unset_top_p_and_max_tokens_take_their_defaults():
    params = sampling_from_proto(common_pb2.SamplingParams(temperature=1.0), prompt_len=4, limits=LIMITS)
    assert (params.top_p, params.max_tokens) == (1.0, 60)


@pytest.mark.parametrize("field, value", [("top_p", 0.0), ("top_p", 1e-46), ("max_tokens", 0)])
def test_a_zero_that_was_sent_is_refused_not_read_as_unset(field, value):
    sampling = common_pb2.SamplingParams(temperature=1.0, **{field: value})
    with pytest.raises(InvalidParameter) as error:
        sampling_from_proto(sampling, prompt_len=4, limits=LIMITS)
    assert error.value.field == field


def test_top_p_is_checked_in_float32():
    """1e-46 is above 0 as a Python float, but 0 in the float32 the sampler uses: it would keep no token."""
    with pytest.raises(InvalidParameter, match="^top_p: "):
        SamplingParams(temperature=1.0, top_p=1e-46)
    assert SamplingParams(temperature=1.0, top_p=1e-30).top_p == 1e-30  # a normal float32


def test_logprobs_unset_is_none_and_zero_is_the_token_alone():
    def read(**fields) -> SamplingParams:
        return sampling_from_proto(common_pb2.SamplingParams(**fields), prompt_len=4, limits=LIMITS)

    assert read().logprobs is None and read().logprobs_mode == "raw"
    assert read(logprobs=0).logprobs == 0
    assert read(logprobs=20, logprobs_mode=common_pb2.TOKEN_LOGPROBS_MODE_PROCESSED).logprobs_mode == "processed"


@pytest.mark.parametrize("fields, name", [(dict(logprobs=21), "logprobs"), (dict(logprobs_mode=7), "logprobs_mode")])
def test_bad_logprobs_fields_are_refused_naming_them(fields, name):
    with pytest.raises(InvalidParameter) as error:
        sampling_from_proto(common_pb2.SamplingParams(**fields), prompt_len=4, limits=LIMITS)
    assert error.value.field == name


def test_an_output_with_logprobs_carries_one_entry_per_token():
    usage = RequestUsage(1, 2, 0, 0, 1)
    entries = [TokenLogprobs(7, -0.5, ((7, -0.5), (3, -1.5))), TokenLogprobs(9, -2.0, ((4, -1.0),))]
    message = output_to_proto(RequestOutput("r", [7, 9], None, usage, entries))
    assert [(e.chosen.token_id, e.chosen.logprob, [(t.token_id, t.logprob) for t in e.top])
            for e in message.logprobs] == [(7, -0.5, [(7, -0.5), (3, -1.5)]), (9, -2.0, [(4, -1.0)])]
    assert not output_to_proto(RequestOutput("r", [7], None, usage)).logprobs
