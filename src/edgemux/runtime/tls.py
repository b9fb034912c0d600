"""TLS on every listener: a server's certificate and key, the CA its clients trust, and a local CA for ``up``.

A service started with ``--tls-cert FILE --tls-key FILE`` (``edgemux controlplane``, ``agent``, ``gateway``)
serves HTTPS only, and its URL says ``https://``. Clients verify it against the CA bundle OpenSSL uses, which
the standard ``SSL_CERT_FILE`` environment variable points at a private CA's certificate: every client in
edgemux (the CLI, the control plane driving agents and gateways, agents and gateways registering, a gateway
forwarding inference, the Python ``Client``, the load generator) and ``tritonclient`` itself read it, so one
variable makes a whole cluster trust its CA. No client ever skips verification.

``edgemux up --tls`` makes the cluster's CA (:class:`ClusterCA`) and one server certificate for the host
(names ``localhost``, the host's name and its loopback and given addresses), hands the certificate to every
process it starts and ``SSL_CERT_FILE`` to their environment, and prints the CA's path for the user's
clients. With ``--engine ray`` each Ray node's processes get a certificate of their own, for that node's
address and name, issued by the same CA when the first process starts there (``engines.ray``); the CA's
key lives in the memory of ``up``'s process only, never in a file, and is dropped when ``up`` ends, so
nothing else can be signed with it (:func:`make_local_ca`: a CA that signs one certificate and forgets its
key at once).

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
from typing import Any

from edgemux.errors import InputError

__all__ = ["CA_ENV", "ClusterCA", "LocalCA", "client_context", "local_names", "make_local_ca", "server_context",
           "write_private"]

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


def local_names(hosts: Iterable[str] = ()) -> list[str]:
    """The names a certificate for this host carries: ``localhost``, the host's name, 127.0.0.1, ::1 and
    ``hosts`` (names or addresses)."""
    return ["localhost", socket.gethostname(), "127.0.0.1", "::1", *hosts]


def write_private(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` (a private key) to ``path``, readable and writable by its owner only (mode 600 as it is
    created: never readable by others, even for an instant); an existing file is replaced."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.unlink(missing_ok=True)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


class ClusterCA:
    """A cluster's certificate authority, made in memory: its certificate is written to ``directory/ca.pem``
    (``path``: what every client trusts), its key never leaves this object. :meth:`issue` signs server
    certificates (valid ``VALID_DAYS`` days, like the CA) until :meth:`forget` drops the key; after that
    nothing can be signed with it, by anyone. Needs ``cryptography`` (the ``serve`` extra)."""

    def __init__(self, directory: str | os.PathLike[str], name: str = "edgemux cluster CA") -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        now = datetime.datetime.now(datetime.timezone.utc)
        self._until = now + datetime.timedelta(days=VALID_DAYS)
        self._key: Any = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = (x509.CertificateBuilder().subject_name(self._name).issuer_name(self._name)
                .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(self._until)
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False, encipher_only=False,
                                             decipher_only=False), critical=True)
                .sign(self._key, hashes.SHA256()))
        self.pem: bytes = cert.public_bytes(serialization.Encoding.PEM)
        self.path = out / "ca.pem"
        self.path.write_bytes(self.pem)

    @property
    def can_issue(self) -> bool:
        """Whether the key is still held (:meth:`forget` not called)."""
        return self._key is not None

    def issue(self, hosts: Iterable[str]) -> tuple[bytes, bytes]:
        """A server certificate for ``hosts`` (names or addresses: its subject alternative names, in order,
        duplicates dropped) and its new private key, both PEM (the key PKCS#8, unencrypted: write it with
        :func:`write_private`). ``RuntimeError`` once the CA's key is forgotten."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        if self._key is None:
            raise RuntimeError("this CA's key is forgotten: it signs nothing more")
        names: list[x509.GeneralName] = []
        for h in hosts:
            h = h.strip("[]")
            try:
                entry: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(h))
            except ValueError:
                entry = x509.DNSName(h)
            if entry not in names:
                names.append(entry)
        if not names:
            raise ValueError("a certificate needs at least one host name or address")
        now = datetime.datetime.now(datetime.timezone.utc)
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "edgemux")]))
                .issuer_name(self._name).public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(self._until)
                .add_extension(x509.SubjectAlternativeName(names), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                .sign(self._key, hashes.SHA256()))
        return (cert.public_bytes(serialization.Encoding.PEM),
                key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))

    def write(self, directory: str | os.PathLike[str], stem: str, hosts: Iterable[str]) -> tuple[Path, Path]:
        """:meth:`issue` for ``hosts``, written to ``directory/<stem>.pem`` and ``<stem>.key`` (mode 600);
        the two paths."""
        cert, key = self.issue(hosts)
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        cert_path, key_path = out / f"{stem}.pem", out / f"{stem}.key"
        cert_path.write_bytes(cert)
        write_private(key_path, key)
        return cert_path, key_path

    def forget(self) -> None:
        """Drop the CA's key: nothing more can be signed with it."""
        self._key = None


def make_local_ca(directory: str | os.PathLike[str], hosts: Iterable[str] = ()) -> LocalCA:
    """Make a CA and a server certificate signed by it in ``directory`` (``ca.pem``, ``server.pem``,
    ``server.key``), for :func:`local_names` of ``hosts``, valid ``VALID_DAYS`` days. The CA's own key is
    used once and never written: no one can sign another certificate with it."""
    ca = ClusterCA(directory, "edgemux local CA")
    cert, key = ca.write(directory, "server", local_names(hosts))
    ca.forget()
    return LocalCA(ca.path, cert, key)
