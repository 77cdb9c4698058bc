"""`specd generate`: stream one completion from a running gateway's gRPC Generate to stdout."""
from __future__ import annotations

import argparse
import sys

import grpc

from specd.serving import open_channel
from specd.v1 import gateway_pb2, gateway_pb2_grpc


def generate(args: argparse.Namespace) -> int:
    """Prints text as it arrives and the usage line on stderr; returns the exit code."""
    request = gateway_pb2.GenerateRequest(prompt=args.prompt, max_tokens=args.max_tokens,
                                          temperature=args.temperature)
    if args.num_speculative_tokens is not None:
        request.num_speculative_tokens = args.num_speculative_tokens
    metadata = (("authorization", f"Bearer {args.api_key}"),) if args.api_key else None
    with open_channel(args.addr, asynchronous=False) as channel:
        try:
            for response in gateway_pb2_grpc.GatewayStub(channel).Generate(request, metadata=metadata):
                sys.stdout.write(response.text)
                sys.stdout.flush()
                if response.finish_reason:
                    _print_usage(response)
        except grpc.RpcError as error:
            print(f"\nspecd generate: {error.code().name}: {error.details()}", file=sys.stderr)
            return 1
    sys.stdout.write("\n")
    return 0


def _print_usage(response: gateway_pb2.GenerateResponse) -> None:
    usage = response.usage
    mean_acceptance = usage.completion_tokens / usage.steps if usage.steps else 0.0
    print(f"\n[{response.finish_reason}] prompt={usage.prompt_tokens} completion={usage.completion_tokens} "
          f"drafts={usage.draft_tokens} accepted={usage.accepted_tokens} steps={usage.steps} "
          f"mean_acceptance={mean_acceptance:.2f}", file=sys.stderr, end="")
