"""TLS and mutual TLS on loopback, with a certificate authority the test creates."""
from __future__ import annotations

import grpc
import pytest

from specd.serving import GrpcServer, ServerConfig, TlsConfig, open_channel
from support.echo_service import ECHO, SERVICE, register_test_service
from support.tls_certs import TestCertificateAuthority

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(30)]


@pytest.fixture(scope="module")
def authority(tmp_path_factory):
    return TestCertificateAuthority(tmp_path_factory.mktemp("tls"))


async def _started(tls: TlsConfig) -> GrpcServer:
    server = GrpcServer(ServerConfig(host="127.0.0.1", port=0, tls=tls),
                        service_names=[SERVICE], register=register_test_service)
    await server.start()
    return server


async def _echo(port: int, tls: TlsConfig | None) -> bytes:
    async with open_channel(f"localhost:{port}", tls) as channel:
        return await channel.unary_unary(ECHO)(b"ping", timeout=5)


async def test_tls_server_answers_a_client_that_trusts_its_ca(authority):
    cert = authority.issue("server", server=True)
    server = await _started(TlsConfig(cert.cert_path, cert.key_path))
    try:
        assert await _echo(server.port, TlsConfig(ca_path=authority.ca_path)) == b"ping"
        with pytest.raises(grpc.aio.AioRpcError) as plaintext:
            await _echo(server.port, None)
        assert plaintext.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop(grace=0)


async def test_mutual_tls_requires_a_client_certificate_from_the_ca(authority, tmp_path):
    cert = authority.issue("server-m", server=True)
    server = await _started(TlsConfig(cert.cert_path, cert.key_path, authority.ca_path))
    client = authority.issue("client", server=False)
    stranger_ca = TestCertificateAuthority(tmp_path, name="stranger CA")
    stranger = stranger_ca.issue("stranger", server=False)
    try:
        with_cert = TlsConfig(client.cert_path, client.key_path, authority.ca_path)
        assert await _echo(server.port, with_cert) == b"ping"
        for tls in (TlsConfig(ca_path=authority.ca_path),
                    TlsConfig(stranger.cert_path, stranger.key_path, authority.ca_path)):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await _echo(server.port, tls)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop(grace=0)

