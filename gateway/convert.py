"""protobuf <-> gateway domain types; with the servicer, the only gateway code that imports *_pb2."""
from __future__ import annotations

from specd.v1 import common_pb2, gateway_pb2, verifier_pb2
from gateway.request import GenerationRequest, ReplicaLoad, SentLogprobs, TextChunk, TokenCandidate, Usage
from gateway.validation import RequestFields
from specd.sampling import CLIENT_FIELDS, WIRE_FIELDS

# logprobs modes: the wire's enum <-> the names validation and the engine use
_LOGPROBS_MODES = {common_pb2.TOKEN_LOGPROBS_MODE_RAW: "raw", common_pb2.TOKEN_LOGPROBS_MODE_PROCESSED: "processed"}
_LOGPROBS_MODE_NUMBERS = {name: number for number, name in _LOGPROBS_MODES.items()}
_HAS_PRESENCE = {field.name: field.has_presence for field in gateway_pb2.GenerateRequest.DESCRIPTOR.fields}


def fields_from_generate_request(message: gateway_pb2.GenerateRequest) -> RequestFields:
    """The client's fields, each by its schema name; unset optional ones stay None so validation fills the
    defaults."""
    sampling = {name: _client_value(message, name) for name in CLIENT_FIELDS}
    return RequestFields(prompt=message.prompt or None, prompt_token_ids=list(message.prompt_token_ids) or None,
                         stop=list(message.stop), sampling=sampling)


def _client_value(message: gateway_pb2.GenerateRequest, name: str):
    if _HAS_PRESENCE[name] and not message.HasField(name):
        return None
    value = getattr(message, name)
    if name == "logprobs_mode":
        return _LOGPROBS_MODES.get(value, str(value))
    return (dict(value) or None) if name == "logit_bias" else value


def verifier_request(request_id: str, request: GenerationRequest) -> verifier_pb2.VerifierGenerateRequest:
    """The verifier call for a validated request: the schema's wire fields by name, the tenant key beside them."""
    sampling = request.sampling
    wire = {name: getattr(sampling, name) for name in WIRE_FIELDS}
    wire["logprobs_mode"] = _LOGPROBS_MODE_NUMBERS[sampling.logprobs_mode]
    return verifier_pb2.VerifierGenerateRequest(
        request_id=request_id, prompt_token_ids=request.prompt_token_ids,
        sampling=common_pb2.SamplingParams(**wire), tenant_key=sampling.tenant_key)


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
                       max_model_len=message.max_model_len, serve_port=message.serve_port)
