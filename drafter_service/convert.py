"""Protobuf <-> domain for the drafter; the only module of drafter_service that imports *_pb2.

Both messages are columnar, like the domain batch, so conversion is a handful of whole-column moves
(the repeated fields are handed over as they are: the stores read any sequence).
"""
from __future__ import annotations

from drafter_service.batch import DraftBatch, ProposeBatch
from specd.sampling import InvalidParameter
from specd.v1 import drafter_pb2


def batch_from_pb(request: drafter_pb2.ProposeRequest) -> ProposeBatch:
    """A ProposeRequest as a ProposeBatch; InvalidParameter (INVALID_ARGUMENT) if its columns disagree."""
    batch = ProposeBatch(
        step_id=request.step_id,
        sequence_ids=request.sequence_ids,
        starts=request.starts,
        new_token_counts=request.new_token_counts,
        new_token_ids=request.new_token_ids,
        draft_limits=request.draft_limits,
        min_ngrams=request.min_ngrams,
        max_ngrams=request.max_ngrams,
        released_sequence_ids=request.released_sequence_ids,
        tenant_keys=request.tenant_keys,
    )
    error = batch.column_error()
    if error is not None:
        raise InvalidParameter(*error)
    return batch


def drafts_to_pb(batch: DraftBatch) -> drafter_pb2.ProposeResponse:
    """A DraftBatch as the ProposeResponse that answers its request."""
    return drafter_pb2.ProposeResponse(step_id=batch.step_id, draft_counts=batch.draft_counts,
                                       draft_token_ids=batch.draft_token_ids,
                                       resync_sequence_ids=batch.resync_sequence_ids)
