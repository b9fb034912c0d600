"""TLS on every listener: a server's certificate and key, the CA its clients trust, and a local CA for ``up``.

A service started with ``--tls-cert FILE --tls-key FILE`` (``edgemux controlplane``, ``agent``, ``gateway``)
serves HTTPS only, and its URL says ``https://``. Clients verify it against the CA bundle OpenSSL uses, which
the standard ``SSL_CERT_FILE`` environment variable points at a private CA's certificate: every client in
edgemux (the CLI, the control plane driving agents and gateways, agents and gateways registering, a gateway
forwarding inference, the Python ``Client``, the load generator) and ``tritonclient`` itself read it, so one
variable makes a whole cluster trust its CA. No client ever skips verification.

``edgemux up --tls`` makes a local CA and one server certificate for the host (``make_local_ca``: names
``localhost``, the host's name and its loopback and given addresses), hands the certificate to every process
it starts and ``SSL_CERT_FILE`` to their environment, and prints the CA's path for the user's clients.

The certificates are made with ``cryptography`` (the ``serve`` extra), imported only here and only when a CA
is made. Units: days.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from edgemux.errors import InputError

__all__ = ["CA_ENV", "LocalCA", "client_context", "make_local_ca", "server_context"]

CA_ENV = "SSL_CERT_FILE"  # OpenSSL's own: the CA bundle every client of the process verifies servers against
VALID_DAYS = 30           # a local cluster's certificates: long enough for any run, short enough to expire


def server_context(cert: str | os.PathLike[str], key: str | os.PathLike[str]) -> ssl.SSLContext:
    """The TLS context of a listener serving ``cert`` (PEM, the chain from the server's certificate up) with
    its private ``key`` (PEM); TLS 1.2 at least. ``InputError`` naming the file that cannot be used."""
    for what, path in (("--tls-cert", cert), ("--tls-key", key)):
        if not Path(path).is_file():
            raise InputError(what, f"{path}: no such file")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(str(cert), str(key))
    except (ssl.SSLError, ValueError) as e:
        raise InputError("--tls-cert", f"{cert} with key {key}: not a certificate and its key ({e})") from None
    return ctx


def client_context(ca: str | os.PathLike[str] | None = None) -> ssl.SSLContext:
    """A verifying client context: against ``ca`` (a PEM bundle) when given, else OpenSSL's defaults (which
    ``SSL_CERT_FILE`` overrides)."""
    ctx = ssl.create_default_context(cafile=str(ca) if ca is not None else None)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def server_options(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """``--tls-cert``/``--tls-key`` as a listener's context (None for neither: plain HTTP); ``InputError``
    for one without the other."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise InputError("--tls-cert" if cert is None else "--tls-key",
                         "TLS needs both --tls-cert and --tls-key")
    return server_context(cert, key)


@dataclass(frozen=True)
class LocalCA:
    """A CA made for one local cluster: its certificate (``ca``, what clients trust) and the server
    certificate and key every process serves (``cert``, ``key``; PEM files, the key mode 600)."""

    ca: Path
    cert: Path
    key: Path


def make_local_ca(directory: str | os.PathLike[str], hosts: Iterable[str] = ()) -> LocalCA:
    """Make a CA and a server certificate signed by it in ``directory``, for ``localhost``, this host's name,
    127.0.0.1, ::1 and ``hosts`` (names or addresses), valid ``VALID_DAYS`` days. The CA's own key is used
    once and never written: no one can sign another certificate with it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    until = now + datetime.timedelta(days=VALID_DAYS)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "edgemux local CA")])
    ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(until)
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                            content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=False, encipher_only=False,
                                            decipher_only=False), critical=True)
               .sign(ca_key, hashes.SHA256()))
    names: list[x509.GeneralName] = []
    for h in ["localhost", socket.gethostname(), "127.0.0.1", "::1", *hosts]:
        try:
            entry: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(h))
        except ValueError:
            entry = x509.DNSName(h)
        if entry not in names:
            names.append(entry)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "edgemux")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(until)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    ca_path, cert_path, key_path = out / "ca.pem", out / "server.pem", out / "server.key"
    ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.unlink(missing_ok=True)
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    return LocalCA(ca_path, cert_path, key_path)
