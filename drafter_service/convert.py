"""Protobuf <-> domain for the drafter; the only module of drafter_service that imports *_pb2."""
from __future__ import annotations

from drafter_service.drafter import DraftBatch, ProposeBatch, SequenceDelta
from specd.v1 import drafter_pb2


def batch_from_pb(request: drafter_pb2.ProposeRequest) -> ProposeBatch:
    """A ProposeRequest as a ProposeBatch (token ids copied once into plain lists)."""
    return ProposeBatch(
        step_id=request.step_id,
        sequences=[
            SequenceDelta(
                sequence_id=s.sequence_id,
                start=s.start,
                new_token_ids=list(s.new_token_ids),
                num_draft_tokens=s.num_draft_tokens,
                min_ngram=s.min_ngram,
                max_ngram=s.max_ngram,
            )
            for s in request.sequences
        ],
        released_sequence_ids=list(request.released_sequence_ids),
    )


def drafts_to_pb(batch: DraftBatch) -> drafter_pb2.ProposeResponse:
    """A DraftBatch as the ProposeResponse that answers its request."""
    return drafter_pb2.ProposeResponse(
        step_id=batch.step_id,
        drafts=[
            drafter_pb2.SequenceDraft(sequence_id=d.sequence_id, draft_token_ids=d.draft_token_ids,
                                      resync=d.resync)
            for d in batch.drafts
        ],
    )
