"""The chart's TLS probe script (helm/specd/files/grpc_health_probe.py) against a real TLS gRPC server."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from support.helm import CHART_DIR
from support.tls_certs import TestCertificateAuthority

PROBE = CHART_DIR / "files" / "grpc_health_probe.py"


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    authority = TestCertificateAuthority(tmp_path_factory.mktemp("tls"))
    server_cert = authority.issue("server", server=True)
    with open(server_cert.key_path, "rb") as key, open(server_cert.cert_path, "rb") as cert:
        credentials = grpc.ssl_server_credentials([(key.read(), cert.read())])
    health_servicer = health.HealthServicer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    env = dict(os.environ, SPECD_TLS_CERT=server_cert.cert_path, SPECD_TLS_KEY=server_cert.key_path,
               SPECD_TLS_CA=authority.ca_path)
    yield health_servicer, port, env
    server.stop(grace=None)


def run_probe(port: int, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(PROBE), "--port", str(port), "--server-name", "localhost"],
                          env=env, capture_output=True, text=True, timeout=30, check=False)


def test_probe_passes_when_the_server_reports_serving(tls_server):
    health_servicer, port, env = tls_server
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    result = run_probe(port, env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "SERVING"


def test_probe_fails_while_the_server_is_not_serving(tls_server):
    health_servicer, port, env = tls_server
    health_servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    result = run_probe(port, env)
    assert result.returncode == 1
    assert result.stdout.strip() == "NOT_SERVING"


def test_probe_fails_when_nothing_listens(tls_server):
    _, _, env = tls_server
    with socket.socket() as unused:  # bound, never listening, then released
        unused.bind(("127.0.0.1", 0))
        free_port = unused.getsockname()[1]
    result = run_probe(free_port, env)
    assert result.returncode == 1
    assert "UNAVAILABLE" in result.stderr
