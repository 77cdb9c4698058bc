"""The verifier's reading of a request: an unset field takes its default, a set one is checked as sent
(0 never stands for "unset" or "off"), in the float32 precision it is sampled with."""
import pytest

from specd.sampling import InvalidParameter, SamplingParams
from specd.v1 import common_pb2, verifier_pb2
from verifier_service.convert import ModelLimits, output_to_proto, request_from_proto, sampling_from_proto
from verifier_service.engine.outputs import RequestOutput, RequestUsage, TokenLogprobs

LIMITS = ModelLimits(name="m", max_model_len=64, vocab_size=100)


def test_unset_top_p_and_max_tokens_take_their_defaults():
    params = sampling_from_proto(common_pb2.SamplingParams(temperature=1.0), prompt_len=4, limits=LIMITS)
    assert (params.top_p, params.max_tokens) == (1.0, 60)


def test_a_negative_k_is_refused_naming_num_speculative_tokens():
    sampling = common_pb2.SamplingParams(temperature=1.0, num_speculative_tokens=-1)  # int32, as the gateway's
    with pytest.raises(InvalidParameter) as error:
        sampling_from_proto(sampling, prompt_len=4, limits=LIMITS)
    assert error.value.field == "num_speculative_tokens"


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


def test_a_resumed_stream_says_how_many_prompt_tokens_were_generated():
    sampling = common_pb2.SamplingParams(temperature=1.0, seed=3, output_position_offset=2)
    request = verifier_pb2.VerifierGenerateRequest(request_id="r", prompt_token_ids=[5, 6, 7], sampling=sampling)
    assert request_from_proto(request, LIMITS)[2].output_position_offset == 2
    request.prompt_token_ids[:] = [6, 7]  # no token of the prompt's own left
    with pytest.raises(InvalidParameter, match="^output_position_offset: "):
        request_from_proto(request, LIMITS)


def test_the_seed_goes_on_the_first_message_only():
    output = RequestOutput("r", [4], None, RequestUsage(1, 1, 0, 0, 1), seed=2**64 - 1)
    assert output_to_proto(output, first=True).seed == 2**64 - 1
    assert not output_to_proto(output).HasField("seed")
    greedy = RequestOutput("r", [4], None, RequestUsage(1, 1, 0, 0, 1))
    assert not output_to_proto(greedy, first=True).HasField("seed")


def test_penalties_and_logit_bias_reach_the_engine_and_unset_means_off():
    unset = sampling_from_proto(common_pb2.SamplingParams(), prompt_len=4, limits=LIMITS)
    assert (unset.presence_penalty, unset.frequency_penalty, unset.repetition_penalty) == (0.0, 0.0, 1.0)
    assert not unset.adjusts_logits
    sampling = common_pb2.SamplingParams(presence_penalty=0.5, frequency_penalty=-1.0, repetition_penalty=1.25,
                                         logit_bias={7: -100.0, 99: 2.5})
    params = sampling_from_proto(sampling, prompt_len=4, limits=LIMITS)
    assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty) == (0.5, -1.0, 1.25)
    assert dict(params.logit_bias) == {7: -100.0, 99: 2.5}


@pytest.mark.parametrize("fields, field", [
    ({"repetition_penalty": 0.0}, "repetition_penalty"),  # sent, so not read as unset (1)
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": float("nan")}, "frequency_penalty"),
    ({"logit_bias": {100: 1.0}}, "logit_bias[100]"),  # outside the vocabulary of 100
    ({"logit_bias": {-3: 1.0}}, "logit_bias[-3]"),
    ({"logit_bias": {5: 100.5}}, "logit_bias[5]"),
    ({"logit_bias": {t: 1.0 for t in range(301)}}, "logit_bias"),
])
def test_bad_penalties_are_refused_naming_the_field(fields, field):
    with pytest.raises(InvalidParameter) as error:
        sampling_from_proto(common_pb2.SamplingParams(**fields), prompt_len=4, limits=LIMITS)
    assert error.value.field == field
