"""Kubelet exec probe for gRPC servers behind TLS (the native `grpc:` probe cannot speak TLS).

Checks grpc.health.v1 on localhost with the pod's own certificate, overriding the name that TLS verifies
so that a certificate issued for the Service name passes. Exits 0 only when the server reports SERVING.
"""
import argparse
import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--server-name", required=True)
    parser.add_argument("--timeout", type=float, default=4.0)
    args = parser.parse_args()

    def read(name: str) -> bytes:
        with open(os.environ[name], "rb") as file:
            return file.read()

    credentials = grpc.ssl_channel_credentials(read("SPECD_TLS_CA"), read("SPECD_TLS_KEY"), read("SPECD_TLS_CERT"))
    options = [("grpc.ssl_target_name_override", args.server_name)]
    with grpc.secure_channel(f"localhost:{args.port}", credentials, options) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=args.timeout)
        except grpc.RpcError as error:
            print(f"health check failed: {error.code().name}: {error.details()}", file=sys.stderr)
            return 1
    serving = reply.status == health_pb2.HealthCheckResponse.SERVING
    print(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
