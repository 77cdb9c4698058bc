"""Server and TLS settings are checked when built, naming the bad field."""
from __future__ import annotations

import pytest

from specd.serving import ServerConfig, TlsConfig


def test_a_server_tls_config_needs_cert_and_key():
    with pytest.raises(ValueError, match="cert_path and key_path"):
        TlsConfig(cert_path="server.crt")
    with pytest.raises(ValueError, match="tls"):
        ServerConfig(tls=TlsConfig(ca_path="ca.crt"))


def test_ports_must_be_tcp_ports():
    with pytest.raises(ValueError, match="metrics_port"):
        ServerConfig(metrics_port=70000)
    with pytest.raises(ValueError, match="^port"):
        ServerConfig(port=-1)
