"""protobuf <-> gateway domain types; with the servicer, the only gateway code that imports *_pb2."""
from __future__ import annotations

from specd.v1 import common_pb2, gateway_pb2, verifier_pb2
from gateway.request import GenerationRequest, ReplicaLoad, SentLogprobs, TextChunk, TokenCandidate, Usage
from gateway.validation import RequestFields

_OPTIONAL_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed",
                    "num_speculative_tokens", "logprobs", "repetition_penalty")
# logprobs modes: the wire's enum <-> the names validation and the engine use
_LOGPROBS_MODES = {common_pb2.TOKEN_LOGPROBS_MODE_RAW: "raw", common_pb2.TOKEN_LOGPROBS_MODE_PROCESSED: "processed"}
_LOGPROBS_MODE_NUMBERS = {name: number for number, name in _LOGPROBS_MODES.items()}


def fields_from_generate_request(message: gateway_pb2.GenerateRequest) -> RequestFields:
    """The client's fields; unset optional fields stay None so validation fills the defaults."""
    optional = {name: getattr(message, name) if message.HasField(name) else None
                for name in _OPTIONAL_FIELDS}
    return RequestFields(
        prompt=message.prompt or None,
        prompt_token_ids=list(message.prompt_token_ids) or None,
        stop=list(message.stop),
        ignore_eos=message.ignore_eos,
        logprobs_mode=_LOGPROBS_MODES.get(message.logprobs_mode, str(message.logprobs_mode)),
        presence_penalty=message.presence_penalty,
        frequency_penalty=message.frequency_penalty,
        logit_bias=dict(message.logit_bias) or None,
        **optional,
    )


def verifier_request(request_id: str, request: GenerationRequest) -> verifier_pb2.VerifierGenerateRequest:
    """The verifier call for a validated request."""
    sampling = request.sampling
    wire = common_pb2.SamplingParams(
        max_tokens=sampling.max_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        min_p=sampling.min_p,
        seed=sampling.seed,
        ignore_eos=sampling.ignore_eos,
        stop_token_ids=sampling.stop_token_ids,
        num_speculative_tokens=sampling.num_speculative_tokens,
        logprobs=sampling.logprobs,
        logprobs_mode=_LOGPROBS_MODE_NUMBERS[sampling.logprobs_mode],
        output_position_offset=sampling.output_position_offset,
        presence_penalty=sampling.presence_penalty,
        frequency_penalty=sampling.frequency_penalty,
        repetition_penalty=sampling.repetition_penalty,
        logit_bias=sampling.logit_bias,
    )
    return verifier_pb2.VerifierGenerateRequest(
        request_id=request_id, prompt_token_ids=request.prompt_token_ids, sampling=wire,
        tenant_key=sampling.tenant_key)


def usage_to_pb(usage: Usage) -> common_pb2.Usage:
    return common_pb2.Usage(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
                            draft_tokens=usage.draft_tokens, accepted_tokens=usage.accepted_tokens,
                            steps=usage.steps, num_speculative_tokens=usage.num_speculative_tokens)


def generate_response(chunk: TextChunk) -> gateway_pb2.GenerateResponse:
    """One message of the Gateway/Generate stream."""
    usage = usage_to_pb(chunk.usage) if chunk.usage is not None else None
    return gateway_pb2.GenerateResponse(text=chunk.text, token_ids=chunk.token_ids,
                                        finish_reason=chunk.finish_reason, usage=usage, seed=chunk.seed,
                                        logprobs=[_sent_logprobs_to_pb(entry) for entry in chunk.logprobs or ()])


def _sent_logprobs_to_pb(entry: SentLogprobs) -> common_pb2.TokenLogprobs:
    return common_pb2.TokenLogprobs(chosen=_candidate_to_pb(entry.chosen),
                                    top=[_candidate_to_pb(candidate) for candidate in entry.top])


def _candidate_to_pb(candidate: TokenCandidate) -> common_pb2.TokenLogprob:
    return common_pb2.TokenLogprob(token_id=candidate.token_id, logprob=candidate.logprob, token=candidate.text,
                                   token_bytes=candidate.utf8)


def get_load_request() -> verifier_pb2.GetLoadRequest:
    return verifier_pb2.GetLoadRequest()


def load_from_pb(message: verifier_pb2.LoadReport) -> ReplicaLoad:
    return ReplicaLoad(num_running=message.num_running, num_waiting=message.num_waiting,
                       kv_cache_usage=message.kv_cache_usage, model=message.model,
                       max_model_len=message.max_model_len)
