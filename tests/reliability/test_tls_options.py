"""How the TLS options reach each service: certificate + key = TLS everywhere (servers and the links
they dial); adding a CA = mutual TLS (peers verified against it, client certificates required)."""
import pytest

from specd.options import ServiceOptions
from drafter_service.config import drafter_config_from_options
from specd_cli.service_configs import gateway_config_from_options
from verifier_service.config import verifier_config_from_options

CERT = dict(tls_cert="/certs/service.crt", tls_key="/certs/service.key")


@pytest.mark.parametrize("ca", [None, "/certs/ca.crt"], ids=["tls", "mtls"])
def test_every_server_and_every_link_it_dials_uses_the_certificate(ca):
    options = ServiceOptions(**CERT, tls_ca=ca)
    verifier = verifier_config_from_options(options)
    gateway = gateway_config_from_options(options)
    drafter = drafter_config_from_options(options)
    for tls in (verifier.server.tls, verifier.drafter_tls, gateway.tls, drafter.tls):
        assert (tls.cert_path, tls.key_path, tls.ca_path) == (CERT["tls_cert"], CERT["tls_key"], ca)


def test_without_a_certificate_every_link_is_plaintext():
    verifier = verifier_config_from_options(ServiceOptions())
    assert verifier.server.tls is None and verifier.drafter_tls is None
    assert gateway_config_from_options(ServiceOptions()).tls is None
    assert drafter_config_from_options(ServiceOptions()).tls is None


def test_a_certificate_without_its_key_is_refused_naming_the_option():
    with pytest.raises(ValueError, match="tls_cert"):
        ServiceOptions(tls_cert="/certs/service.crt")
