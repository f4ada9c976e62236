"""The lab's TLS (`inferfleet lab up --tls`): a CA of its own and a certificate for the
load balancers signed by it, naming each host and its address. The CA's certificate is
public (clients trust it: curl --cacert, the openai SDK); the server's key is written
only to the lab's private inventory file (mode 0600)."""

from __future__ import annotations

import datetime
import ipaddress

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

DAYS = 30


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(subject: str, issuer: x509.Name, key, now) -> x509.CertificateBuilder:
    """A certificate of `subject` for `key`, signed by `issuer`, valid for DAYS days."""
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=DAYS))
    )


def _pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def issue(hosts: dict[str, str]) -> dict[str, str]:
    """{ca, certificate, key} (PEM): a fresh CA, and one certificate for every host and
    its address (IP) in `hosts` that it signed, valid for DAYS days."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        _builder("inferfleet lab CA", _name("inferfleet lab CA"), ca_key, now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(next(iter(hosts)), ca.subject, key, now)
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    name
                    for host, address in hosts.items()
                    for name in (x509.DNSName(host), x509.IPAddress(ipaddress.ip_address(address)))
                ]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return {"ca": _pem(ca), "certificate": _pem(cert), "key": key_pem}


def names(certificate: str) -> set[str]:
    """The host names and addresses a certificate (PEM) is for."""
    cert = x509.load_pem_x509_certificate(certificate.encode())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return set(san.get_values_for_type(x509.DNSName)) | {
        str(a) for a in san.get_values_for_type(x509.IPAddress)
    }
