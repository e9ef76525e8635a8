"""Throwaway certificates for the tests: a CA, certificates it signs, their PEM files.
Made per test run with ``cryptography``; no key is ever committed."""

from __future__ import annotations

import datetime

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

Key = ec.EllipticCurvePrivateKey


def new_key() -> Key:
    return ec.generate_private_key(ec.SECP256R1())


def name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def certificate(
    subject: str,
    key: Key,
    issuer: tuple[x509.Certificate, Key] | None,
    *,
    ca: bool = False,
    names: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    """A certificate for ``subject``'s ``key``, signed by ``issuer`` (self-signed when
    ``None``), valid from five minutes ago for a day."""
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, signer = (issuer[0].subject, issuer[1]) if issuer else (name(subject), key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(signer, hashes.SHA256())


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def key_pem(key: Key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def self_signed_ca(common: str = "lab CA") -> bytes:
    """A CA certificate's PEM, as a host's ``tls_ca`` holds it."""
    return pem(certificate(common, new_key(), None, ca=True))
