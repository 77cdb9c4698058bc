"""Protobuf <-> engine objects for the verifier: the only module here, besides the servicer, that
imports *_pb2. Bad input raises InvalidParameter naming the field (INVALID_ARGUMENT on the wire)."""
from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, replace

from specd.sampling import WIRE_FIELDS, InvalidParameter, SamplingParams
from specd.v1 import common_pb2, verifier_pb2
from verifier_service.engine.outputs import EngineLoad, RequestOutput, RequestUsage, TokenLogprobs


MAX_TENANT_KEY_BYTES = 128  # the gateway sends 32 hex digits; the drafter refuses longer keys
# The wire's logprobs modes by the engine's names; an unknown number is refused by SamplingParams, naming the field.
_LOGPROBS_MODES = {common_pb2.TOKEN_LOGPROBS_MODE_RAW: "raw", common_pb2.TOKEN_LOGPROBS_MODE_PROCESSED: "processed"}


@dataclass(frozen=True)
class ModelLimits:
    """What a request is checked against."""

    name: str
    max_model_len: int
    vocab_size: int


def request_from_proto(request: verifier_pb2.VerifierGenerateRequest,
                       limits: ModelLimits) -> tuple[str, list[int], SamplingParams]:
    """(request_id, prompt_token_ids, SamplingParams) of a Generate call, validated."""
    if not request.request_id:
        raise InvalidParameter("request_id", "must be set")
    prompt = list(request.prompt_token_ids)
    if not prompt:
        raise InvalidParameter("prompt_token_ids", "must not be empty")
    if len(prompt) >= limits.max_model_len:
        raise InvalidParameter("prompt_token_ids", f"{len(prompt)} tokens leave no room to generate "
                                                   f"within max_model_len {limits.max_model_len}")
    if min(prompt) < 0 or max(prompt) >= limits.vocab_size:
        raise InvalidParameter("prompt_token_ids", f"ids must be in [0, {limits.vocab_size})")
    if len(request.tenant_key.encode()) > MAX_TENANT_KEY_BYTES:
        raise InvalidParameter("tenant_key", f"must be at most {MAX_TENANT_KEY_BYTES} bytes")
    params = sampling_from_proto(request.sampling, len(prompt), limits)
    if params.output_position_offset >= len(prompt):
        raise InvalidParameter("output_position_offset", f"must be less than the prompt's {len(prompt)} tokens "
                                                         "(it counts the generated tokens the prompt ends with)")
    return request.request_id, prompt, replace(params, tenant_key=request.tenant_key)


def sampling_from_proto(sampling: common_pb2.SamplingParams, prompt_len: int,
                        limits: ModelLimits) -> SamplingParams:
    """Proto fields mapped to the schema's, each by its name: an `optional` field left unset takes the schema's
    default (max_tokens: up to the context length), a value that is set is checked as sent (0 is never read as
    "unset"); the other fields' zero values are the schema's neutral defaults."""
    values = {name: _from_wire(sampling, name) for name in WIRE_FIELDS
              if not _HAS_PRESENCE[name] or sampling.HasField(name)}
    room = limits.max_model_len - prompt_len
    values["max_tokens"] = min(values["max_tokens"], room) if "max_tokens" in values else room
    params = SamplingParams(**values)
    params.check_vocabulary(limits.vocab_size)
    return params


_HAS_PRESENCE = {field.name: field.has_presence for field in common_pb2.SamplingParams.DESCRIPTOR.fields}


def _from_wire(sampling: common_pb2.SamplingParams, name: str):
    value = getattr(sampling, name)
    if name == "logprobs_mode":
        return _LOGPROBS_MODES.get(value, str(value))
    if name == "logit_bias":
        return dict(value)
    return tuple(value) if name == "stop_token_ids" else value


def output_to_proto(output: RequestOutput, first: bool = False) -> verifier_pb2.VerifierGenerateResponse:
    """One step's tokens and the usage so far; the seed on the first message, the finish reason on the last."""
    response = verifier_pb2.VerifierGenerateResponse(token_ids=output.new_token_ids,
                                                     usage=usage_to_proto(output.usage))
    if output.logprobs is not None:
        response.logprobs.extend(token_logprobs_to_proto(entry) for entry in output.logprobs)
    if first and output.seed is not None:
        response.seed = output.seed
    if output.finished:
        response.finish_reason = output.finish_reason.value
    return response


def serve_response(outputs: list[RequestOutput], first_ids: Container[str],
                   errors: list[tuple[str, int, str]] = ()) -> verifier_pb2.ServeResponse:
    """One Serve stream message, columns filled from the outputs of a step (and `errors`: request id, grpc
    status code, message, each that request's last update); the seed where a request's id is in `first_ids`."""
    request_ids, counts, tokens, finish_reasons = [], [], [], []
    usage_columns: tuple[list[int], ...] = ([], [], [], [], [], [])
    response = verifier_pb2.ServeResponse()
    for index, output in enumerate(outputs):
        request_ids.append(output.request_id)
        counts.append(len(output.new_token_ids))
        tokens += output.new_token_ids
        finish_reasons.append(output.finish_reason.value if output.finish_reason is not None else "")
        usage = output.usage
        for column, value in zip(usage_columns, (usage.prompt_tokens, usage.completion_tokens, usage.draft_tokens,
                                                 usage.accepted_tokens, usage.steps, usage.num_speculative_tokens)):
            column.append(value)
        if output.seed is not None and output.request_id in first_ids:
            response.seeds[index] = output.seed
        if output.logprobs is not None:
            response.logprobs[index].entries.extend(token_logprobs_to_proto(entry) for entry in output.logprobs)
    for request_id, code, message in errors:
        response.errors[len(request_ids)].CopyFrom(verifier_pb2.RequestError(code=code, message=message))
        request_ids.append(request_id)
        counts.append(0)
        finish_reasons.append("")
        for column in usage_columns:
            column.append(0)
    response.request_ids.extend(request_ids)
    response.token_counts.extend(counts)
    response.token_ids.extend(tokens)
    response.finish_reasons.extend(finish_reasons)
    for field, column in zip(("prompt_tokens", "completion_tokens", "draft_tokens", "accepted_tokens", "steps",
                              "num_speculative_tokens"), usage_columns):
        getattr(response, field).extend(column)
    return response


def token_logprobs_to_proto(entry: TokenLogprobs) -> common_pb2.TokenLogprobs:
    top = [common_pb2.TokenLogprob(token_id=token_id, logprob=logprob) for token_id, logprob in entry.top]
    return common_pb2.TokenLogprobs(chosen=common_pb2.TokenLogprob(token_id=entry.token_id, logprob=entry.logprob),
                                    top=top)


def usage_to_proto(usage: RequestUsage) -> common_pb2.Usage:
    return common_pb2.Usage(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
                            draft_tokens=usage.draft_tokens, accepted_tokens=usage.accepted_tokens,
                            steps=usage.steps, num_speculative_tokens=usage.num_speculative_tokens)


def load_to_proto(load: EngineLoad, num_pending: int, limits: ModelLimits,
                  serve_port: int = 0) -> verifier_pb2.LoadReport:
    """The routing report; requests not yet seen by the engine count as waiting."""
    return verifier_pb2.LoadReport(
        num_running=load.num_running, num_waiting=load.num_waiting + num_pending,
        kv_cache_usage=load.kv_cache_usage, num_used_blocks=load.num_used_blocks,
        num_total_blocks=load.num_total_blocks, model=limits.name, max_model_len=limits.max_model_len,
        serve_port=serve_port,
    )
