"""Request validation: every bad field is refused with an error naming it; defaults are filled in."""
import pytest

from gateway.openai.schema import CompletionBody, parse_body
from gateway.validation import RequestError, RequestFields, validate, validate_model_name
from specd.sampling import CLIENT_FIELDS

MAX_MODEL_LEN = 64


def check(tokenizer, **fields):
    return validate(RequestFields.of(**fields), tokenizer, MAX_MODEL_LEN)


BAD_FIELDS = [
    ({"prompt": "hi", "prompt_token_ids": [1, 2]}, "prompt"),
    ({}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": "word " * 100}, "prompt"),
    ({"prompt_token_ids": [1, 49152]}, "prompt_token_ids"),
    ({"prompt_token_ids": [-1]}, "prompt_token_ids"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": -5}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": MAX_MODEL_LEN}, "max_tokens"),
    ({"prompt": "hi", "temperature": -0.1}, "temperature"),
    ({"prompt": "hi", "temperature": float("nan")}, "temperature"),
    ({"prompt": "hi", "top_p": 0.0}, "top_p"),
    ({"prompt": "hi", "top_p": 1.5}, "top_p"),
    ({"prompt": "hi", "top_k": -2}, "top_k"),
    ({"prompt": "hi", "min_p": -0.5}, "min_p"),
    ({"prompt": "hi", "min_p": 1.5}, "min_p"),
    ({"prompt": "hi", "seed": -1}, "seed"),
    ({"prompt": "hi", "stop": [""]}, "stop"),
    ({"prompt": "hi", "num_speculative_tokens": -1}, "num_speculative_tokens"),
    ({"messages": []}, "messages"),
    ({"prompt": "hi", "presence_penalty": 2.5}, "presence_penalty"),
    ({"prompt": "hi", "frequency_penalty": -3}, "frequency_penalty"),
    ({"prompt": "hi", "frequency_penalty": float("inf")}, "frequency_penalty"),
    ({"prompt": "hi", "repetition_penalty": 0}, "repetition_penalty"),
    ({"prompt": "hi", "repetition_penalty": 1e-46}, "repetition_penalty"),  # 0 as a 32-bit float
    ({"prompt": "hi", "logit_bias": {"49152": 1}}, 'logit_bias["49152"]'),
    ({"prompt": "hi", "logit_bias": {"5": 100.5}}, 'logit_bias["5"]'),
    ({"prompt": "hi", "logit_bias": {"5": float("nan")}}, 'logit_bias["5"]'),
    ({"prompt": "hi", "logit_bias": {"5": 1, "05": 2}}, 'logit_bias["05"]'),
    ({"prompt": "hi", "logit_bias": {" 5": 1}}, "logit_bias"),
    ({"prompt": "hi", "logit_bias": {"-5": 1}}, "logit_bias"),
    ({"prompt": "hi", "logit_bias": {str(t): 1 for t in range(301)}}, "logit_bias"),
    ({"prompt": "hi", "logit_bias": {49152: 1}}, "logit_bias[49152]"),  # gRPC's keys are ints
]


@pytest.mark.parametrize("fields,field", BAD_FIELDS)
def test_a_bad_field_is_refused_naming_it(tokenizer, fields, field):
    with pytest.raises(RequestError) as error:
        check(tokenizer, **fields)
    assert error.value.field == field
    assert str(error.value).startswith(f"{field}: ")


def test_defaults_fill_the_context_and_sample_at_temperature_one(tokenizer):
    request = check(tokenizer, prompt="Hello")
    prompt_len = len(tokenizer.encode("Hello"))
    assert request.prompt_token_ids == tuple(tokenizer.encode("Hello"))
    assert request.sampling.max_tokens == MAX_MODEL_LEN - prompt_len
    sampling = request.sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p) == (1.0, 1.0, 0, 0.0)
    assert request.sampling.num_speculative_tokens is None and request.sampling.seed is None


def test_end_of_sequence_ids_become_stop_token_ids(tokenizer):
    assert check(tokenizer, prompt="Hi").sampling.stop_token_ids == (2,)  # <|im_end|>


def test_top_k_minus_one_means_off_and_speculation_can_be_turned_off(tokenizer):
    request = check(tokenizer, prompt_token_ids=[1, 2, 3], top_k=-1, num_speculative_tokens=0,
                    max_tokens=MAX_MODEL_LEN - 3)
    sampling = request.sampling
    assert (sampling.top_k, sampling.num_speculative_tokens, sampling.max_tokens) == (0, 0, MAX_MODEL_LEN - 3)


def test_chat_messages_are_rendered_with_the_models_template(tokenizer):
    messages = [{"role": "user", "content": "What is 2+2?"}]
    request = validate(RequestFields(messages=messages), tokenizer, 2048)
    text = tokenizer.hf.decode(list(request.prompt_token_ids))
    assert text.endswith("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    assert text.startswith("<|im_start|>system\n")  # the template's default system prompt
    assert request.prompt_token_ids.count(1) == 3  # <|im_start|> once per turn, not doubled as BOS


def test_model_name_must_be_one_the_server_serves():
    validate_model_name("default", ("SmolLM2-135M-Instruct", "default"))
    with pytest.raises(RequestError) as error:
        validate_model_name("gpt-4", ("SmolLM2-135M-Instruct", "default"))
    assert error.value.field == "model"


@pytest.mark.parametrize("fields, field", [
    ({"prompt": "abc \ud800 def"}, "prompt"),
    ({"prompt": "hi", "stop": ["ok", "\udfff"]}, "stop"),
    ({"messages": [{"role": "user", "content": "abc \ud800"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "hi", "name": "\udc00"}]}, "messages[0].name"),
], ids=["prompt", "stop", "content", "name"])
def test_a_lone_surrogate_is_refused_naming_its_field(tokenizer, fields, field):
    with pytest.raises(RequestError) as error:
        validate(RequestFields.of(**fields), tokenizer, 2048)
    assert error.value.field == field and "surrogate" in error.value.message


def test_text_longer_in_bytes_than_the_context_can_hold_is_refused_untokenized(tokenizer, monkeypatch):
    """Emoji are 1 character but 4 bytes: a character count alone let 1.9 MB through to the tokenizer."""
    monkeypatch.setattr(tokenizer, "_text_encoder", None)  # tokenizing would fail loudly
    context = 2048
    emoji = "🎉" * (tokenizer.max_token_chars * context // 2)  # few enough characters, too many bytes
    for fields, field in [({"prompt": emoji}, "prompt"), ({"messages": [{"role": "user", "content": emoji}]}, "messages")]:
        with pytest.raises(RequestError) as error:
            validate(RequestFields.of(**fields), tokenizer, context)
        assert error.value.field == field and "bytes" in error.value.message


@pytest.mark.parametrize("field, value", [("top_p", 1e-46), ("top_p", 1e-45 / 4), ("min_p", 1e39),
                                          ("temperature", 1e39)])
def test_sampling_floats_are_checked_as_the_float32_the_verifier_uses(tokenizer, field, value):
    with pytest.raises(RequestError) as error:
        check(tokenizer, prompt="hi", **{field: value})
    assert error.value.field == field


def test_the_smallest_float32_top_p_is_kept(tokenizer):
    assert check(tokenizer, prompt="hi", top_p=1e-45).sampling.top_p > 0


def test_a_default_max_tokens_is_clamped_to_the_room_left(tokenizer):
    assert check(tokenizer, prompt="hi", default_max_tokens=16).sampling.max_tokens == 16
    assert check(tokenizer, prompt_token_ids=[5] * (MAX_MODEL_LEN - 3), default_max_tokens=16).sampling.max_tokens == 3


def test_errors_name_the_field_the_client_sent(tokenizer):
    names = {"prompt_token_ids": "prompt", "max_tokens": "max_completion_tokens"}
    for fields, field in [({"prompt_token_ids": [10**6]}, "prompt"),
                          ({"prompt_token_ids": [5] * MAX_MODEL_LEN}, "prompt"),
                          ({"prompt": "hi", "max_tokens": 0}, "max_completion_tokens"),
                          ({"messages": [{"role": "user", "content": "word " * 100}]}, "messages")]:
        with pytest.raises(RequestError) as error:
            check(tokenizer, client_names=names, **fields)
        assert error.value.field == field, fields


def test_an_unknown_model_error_names_the_served_model_not_its_path(tokenizer):
    served = ("SmolLM2-135M-Instruct", "default")
    with pytest.raises(RequestError) as error:
        validate_model_name("gpt-4", served)
    assert "SmolLM2-135M-Instruct" in error.value.message and "/" not in error.value.message


def test_penalties_default_to_off_and_logit_bias_keys_become_token_ids(tokenizer):
    request = check(tokenizer, prompt="hi")
    assert (request.sampling.presence_penalty, request.sampling.frequency_penalty, request.sampling.repetition_penalty) == (0.0, 0.0, 1.0)
    assert request.sampling.logit_bias == {}
    request = check(tokenizer, prompt="hi", presence_penalty=-2, frequency_penalty=0.1, repetition_penalty=1.3,
                    logit_bias={"50": 100, "7": -100, "1": 0.1})
    assert (request.sampling.presence_penalty, request.sampling.repetition_penalty) == (-2.0, pytest.approx(1.3))
    assert request.sampling.logit_bias == {1: pytest.approx(0.1), 7: -100.0, 50: 100.0}


# A value other than the default for every field a client sets (specd/sampling.py's CLIENT_FIELDS).
CLIENT_VALUES = {"max_tokens": 5, "temperature": 0.5, "top_p": 0.5, "top_k": 3, "min_p": 0.25, "seed": 7,
                 "ignore_eos": True, "num_speculative_tokens": 2, "logprobs": 3, "logprobs_mode": "processed",
                 "presence_penalty": 0.5, "frequency_penalty": 0.25, "repetition_penalty": 1.5,
                 "logit_bias": {"5": 1.0}}


def test_every_client_field_reaches_the_schema_from_the_http_body(tokenizer):
    """The OpenAI body and the validation take their fields from the schema: one added there arrives here."""
    assert set(CLIENT_VALUES) == set(CLIENT_FIELDS)
    body = parse_body(CompletionBody, {"prompt": "hi", **CLIENT_VALUES})
    sampling = validate(body.request_fields(), tokenizer, MAX_MODEL_LEN).sampling
    for name, value in CLIENT_VALUES.items():
        assert getattr(sampling, name) == ({5: 1.0} if name == "logit_bias" else value), name
