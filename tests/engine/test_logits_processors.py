"""Each verify row is adjusted as the definitions say (docs/API.md: logit bias, then repetition, frequency and presence
penalty) with the tokens before its position, checked against a plain per-token reference; nothing is built or
copied for a batch that uses none of it."""
from collections import Counter

import torch

from specd.sampling import SamplingParams
from verifier_service.engine.batch import ScheduledBatch, ScheduledRequest
from verifier_service.engine.logits_processors import apply_logits_processors
from verifier_service.engine.request import Request
from verifier_service.engine.sampling_metadata import SamplingMetadata

VOCAB = 12
PARAMS = SamplingParams(presence_penalty=0.5, frequency_penalty=-0.25, repetition_penalty=1.7,
                        logit_bias={2: 3.0, 9: -1.5})


def reference_row(logits: torch.Tensor, prompt: list[int], output: list[int], params: SamplingParams) -> torch.Tensor:
    """The definitions, one token at a time."""
    row = logits.clone()
    for token, bias in params.logit_bias.items():
        row[token] += bias
    penalty = params.repetition_penalty
    for token in set(prompt) | set(output):
        row[token] = row[token] / penalty if row[token] > 0 else row[token] * penalty
    for token, count in Counter(output).items():
        row[token] -= params.frequency_penalty * count
        row[token] -= params.presence_penalty
    return row


def decoding_request(request_id: str, prompt: list[int], output: list[int], params: SamplingParams) -> Request:
    request = Request(request_id, prompt, params, 0)
    request.append_output(output)
    return request


def verify_entry(request: Request, drafts: list[int], start: int) -> ScheduledRequest:
    """The request's last token and its drafts, scored from position start."""
    return ScheduledRequest(request.request_id, request.token_ids[-1:] + drafts, start, [0, 1, 2, 3],
                            len(drafts), len(drafts) + 1)


def adjusted(batch: ScheduledBatch, requests: list[Request], logits: torch.Tensor) -> torch.Tensor:
    return apply_logits_processors(logits, SamplingMetadata.build(batch, requests, logits.device).logits_processors)


def test_every_row_counts_the_output_and_the_drafts_before_it():
    prompt, output, drafts = [1, 2, 3, 3], [4, 4, 5], [5, 6, 4]
    request = decoding_request("a", prompt, output, PARAMS)
    logits = torch.randn(len(drafts) + 1, VOCAB, generator=torch.Generator().manual_seed(0)) * 3
    result = adjusted(ScheduledBatch([verify_entry(request, drafts, len(prompt) + len(output) - 1)]), [request], logits)
    for j in range(len(drafts) + 1):
        torch.testing.assert_close(result[j], reference_row(logits[j], prompt, output + drafts[:j], PARAMS))


def test_a_step_launched_ahead_counts_what_the_step_in_flight_emits_on_the_device():
    """Async scheduling: the host knows the output only up to a placeholder; the step in flight scored drafts
    [7, 8, 9] and (its result, still on the device) accepted 2 of them, then emitted 10."""
    prompt, output, in_flight, drafts = [1, 2], [4, 7], [7, 8, 9], [3, 7]
    request = decoding_request("a", prompt, output, PARAMS)
    request.append_pending_token(in_flight)
    entry = verify_entry(request, drafts, len(prompt) + len(output))
    entry.previous_token_row, entry.previous_num_drafts = 1, len(in_flight)
    batch = ScheduledBatch([entry], previous_result=torch.tensor([[0, 0], [10, 2]]))
    logits = torch.randn(len(drafts) + 1, VOCAB, generator=torch.Generator().manual_seed(1)) * 3
    result = adjusted(batch, [request], logits)
    emitted = output + in_flight[:2] + [10]
    for j in range(len(drafts) + 1):
        torch.testing.assert_close(result[j], reference_row(logits[j], prompt, emitted + drafts[:j], PARAMS))


def test_rows_of_other_requests_are_left_as_the_model_made_them():
    plain = decoding_request("plain", [1, 2], [3], SamplingParams())
    biased = decoding_request("biased", [1, 2], [3], SamplingParams(logit_bias={4: 5.0}))
    batch = ScheduledBatch([verify_entry(plain, [5], 2), verify_entry(biased, [6], 2)])
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(2))
    result = adjusted(batch, [plain, biased], logits)
    assert torch.equal(result[:2], logits[:2])
    torch.testing.assert_close(result[2:], logits[2:] + 5.0 * torch.nn.functional.one_hot(torch.tensor(4), VOCAB))


def test_a_batch_without_penalties_or_bias_builds_nothing_and_keeps_its_logits():
    requests = [decoding_request(f"r{i}", [1, 2, 3], [4], SamplingParams(temperature=0.5 * i)) for i in range(3)]
    batch = ScheduledBatch([verify_entry(r, [5, 6], 3) for r in requests])
    metadata = SamplingMetadata.build(batch, requests, torch.device("cpu"))
    assert metadata.logits_processors is None
    logits = torch.randn(9, VOCAB)
    assert apply_logits_processors(logits, metadata.logits_processors) is logits


def test_only_a_logit_bias_builds_no_counts():
    request = decoding_request("a", [1, 2], [3], SamplingParams(logit_bias={4: 1.0}))
    inputs = SamplingMetadata.build(ScheduledBatch([verify_entry(request, [5], 2)]), [request],
                                    torch.device("cpu")).logits_processors
    assert inputs.bias is not None and not inputs.penalized
    assert all(inputs.lists[name].numel() == 0 for name in ("output_tokens", "prompt_tokens", "candidates"))
