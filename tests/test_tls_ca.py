"""The cluster's CA (``runtime.tls.ClusterCA``): it signs server certificates for the names it is given until
its key is forgotten, its key never in a file; what the Ray launcher sends a node's process (its node's
certificate and key in place of the driver's, the CA its ``SSL_CERT_FILE`` names). The end-to-end checks,
HTTPS on every Ray node, are ``tests/test_engine_ray_tls.py`` (slow)."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

x509 = pytest.importorskip("cryptography.x509")

from edgemux.engines.local import ProcessSpec  # noqa: E402
from edgemux.runtime.tls import CA_ENV, ClusterCA, make_local_ca, server_context, write_private  # noqa: E402


def _names(pem: bytes) -> list[str]:
    cert = x509.load_pem_x509_certificate(pem)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [str(a) for a in san.get_values_for_type(x509.IPAddress)] + san.get_values_for_type(x509.DNSName)


def _handshake(ca: Path, cert: Path, key: Path, server_name: str) -> None:
    """A TLS handshake in memory: a server with ``cert``/``key``, a client trusting ``ca`` only, asking for
    ``server_name``; raises ``ssl.SSLCertVerificationError`` when the client refuses."""
    s_in, s_out, c_in, c_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    server = server_context(cert, key).wrap_bio(s_in, s_out, server_side=True)
    client = ssl.create_default_context(cafile=str(ca)).wrap_bio(c_in, c_out, server_hostname=server_name)
    done = set()
    for _ in range(10):
        for name, side, out, peer_in in (("client", client, c_out, s_in), ("server", server, s_out, c_in)):
            try:
                side.do_handshake()
                done.add(name)
            except ssl.SSLWantReadError:
                pass
            peer_in.write(out.read())
        if done == {"client", "server"}:
            return
    raise AssertionError("no handshake")


def test_the_cluster_ca_issues_certificates_for_given_names_until_it_forgets_its_key(tmp_path: Path) -> None:
    ca = ClusterCA(tmp_path / "tls")
    assert ca.path.read_bytes() == ca.pem and ca.can_issue
    assert [p.name for p in (tmp_path / "tls").iterdir()] == ["ca.pem"]  # the CA's key is in no file
    cert1, key1 = ca.issue(["10.0.0.11", "edge-1", "localhost", "10.0.0.11"])
    assert _names(cert1) == ["10.0.0.11", "edge-1", "localhost"]  # in order, duplicates dropped
    cert_path, key_path = ca.write(tmp_path / "n2", "server", ["10.0.0.12", "[::1]"])
    assert key_path.stat().st_mode & 0o777 == 0o600
    assert sorted(_names(cert_path.read_bytes())) == ["10.0.0.12", "::1"]
    # a client trusting the CA only accepts the certificate for its names, and no other
    _handshake(ca.path, cert_path, key_path, "10.0.0.12")
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(ca.path, cert_path, key_path, "10.0.0.11")
    # each certificate its own key
    assert key1 != key_path.read_bytes()
    ca.forget()
    assert not ca.can_issue
    with pytest.raises(RuntimeError, match="forgotten"):
        ca.issue(["10.0.0.13"])


def test_make_local_ca_signs_one_certificate_for_this_host(tmp_path: Path) -> None:
    made = make_local_ca(tmp_path, ["192.0.2.7"])
    names = _names(made.cert.read_bytes())
    assert {"localhost", "127.0.0.1", "::1", "192.0.2.7"} <= set(names)
    assert made.key.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca.pem", "server.key", "server.pem"]
    _handshake(made.ca, made.cert, made.key, "192.0.2.7")


def test_write_private_is_the_owners_only_from_the_start(tmp_path: Path) -> None:
    path = tmp_path / "a" / "key.pem"
    path.parent.mkdir()
    path.write_bytes(b"old")
    path.chmod(0o644)
    write_private(path, b"secret")
    assert path.read_bytes() == b"secret" and path.stat().st_mode & 0o777 == 0o600


def test_the_ray_launcher_sends_a_process_its_nodes_certificate_and_the_ca(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    from edgemux.engines.ray import _files_of

    ca = ClusterCA(tmp_path / "tls")
    cert, key = ca.write(tmp_path / "tls", "server", ["127.0.0.1"])
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("cluster")
    spec = ProcessSpec("agent edge-1", "agent", ("agent", "--cluster", str(cluster), "--tls-cert", str(cert),
                                                  "--tls-key", str(key)), node="edge-1",
                       env=((CA_ENV, str(ca.path)), ("EDGEMUX_TOKEN", "t")))
    node_cert, node_key = ca.issue(["10.0.0.11"])
    files = _files_of(spec, (node_cert, node_key))
    assert files == {str(cluster): b"cluster", str(cert): node_cert, str(key): node_key, str(ca.path): ca.pem}
    # without a node's certificate, the files the arguments name
    assert _files_of(spec)[str(key)] == key.read_bytes()
