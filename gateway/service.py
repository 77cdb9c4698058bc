"""The specd.v1.Gateway servicer: protobuf in, pipeline, protobuf out."""
from __future__ import annotations

import asyncio
from contextlib import aclosing

import grpc

from gateway import convert
from gateway.pipeline import Pipeline, deadline_passed
from gateway.router import UpstreamError
from gateway.tenant import TENANT_HEADER, tenant_key
from gateway.validation import RequestError
from specd.v1 import gateway_pb2, gateway_pb2_grpc


class GatewayServicer(gateway_pb2_grpc.GatewayServicer):
    """Generate streams the pipeline's text chunks; a client cancel closes the pipeline (and the verifier call)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    async def Generate(self, request: gateway_pb2.GenerateRequest, context: grpc.aio.ServicerContext):
        deadline = _deadline(context)
        try:
            metadata = dict(context.invocation_metadata() or ())
            tenant = tenant_key(metadata.get("authorization"), metadata.get(TENANT_HEADER))
            generation = await self.pipeline.validate(convert.fields_from_generate_request(request), tenant)
        except RequestError as error:
            self.pipeline.metrics.count_rejected(grpc.StatusCode.INVALID_ARGUMENT.name)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, error.message)
        except asyncio.CancelledError:  # gRPC cancels the handler at the deadline, here while tokenizing
            if deadline_passed(deadline):
                self.pipeline.metrics.count_rejected(grpc.StatusCode.DEADLINE_EXCEEDED.name)
            raise
        try:
            # aclosing: if this handler is abandoned at a yield, the verifier call is still cancelled now.
            async with aclosing(self.pipeline.generate(generation, deadline)) as chunks:
                async for chunk in chunks:
                    yield convert.generate_response(chunk)
        except UpstreamError as error:
            await context.abort(error.code, error.message)


def _deadline(context: grpc.aio.ServicerContext) -> float | None:
    """The client's deadline as event-loop time, so the verifier call gets what is left of it."""
    remaining = context.time_remaining()
    if remaining is None:
        return None
    return asyncio.get_running_loop().time() + remaining
