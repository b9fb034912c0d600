"""``edgemux up --engine ray --tls`` (issue 38, item 4): HTTPS on every Ray node, each node's processes with
a certificate of their own issued by the cluster's CA at start-up, every process trusting that CA.

A local Ray cluster (``tests/test_engine_ray.py``'s fixture: a head and three worker nodes, each a raylet of
its own declaring ``edgemux-node-edge-N``; on one host they share one address) and ``edgemux up --engine ray
--tls`` as a child process, authentication on. The test checks, for the control plane, the gateway and every
agent: an HTTPS GET verified against the cluster's CA as the only trust anchor succeeds, one verified against
the system's CAs fails; each agent's certificate is its Ray node's own (a serial of its own, the node's
address among its names), and the control plane and the gateway share the head node's; on the node, the key
file the process serves is its owner's only (mode 600) and its ``SSL_CERT_FILE`` is a copy of the CA there.
The processes speak HTTPS to one another: the agents registered, an app applied is served through the
gateway. Every wait is bounded.

The same across namespaced hosts (``tests/nethosts.py``: network namespaces joined by a bridge, each with an
address of its own; root only, skipped elsewhere): a Ray head on host 0 (where ``up`` runs, with the control
plane and the gateway) and a Ray worker on each of hosts 1-3 (one edge node each), so that every node's
certificate names a different address, the one its agent listens on.
"""

from __future__ import annotations

import json
import queue
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("ray")
pytest.importorskip("cryptography")
from cryptography import x509  # noqa: E402

from edgemux.engines.ray import node_resource  # noqa: E402
from edgemux.runtime.dataplane.protocol import DATATYPES, encode_infer_request  # noqa: E402
from test_engine_ray import CLUSTER_YAML, NODES, START_S, STEP_S, ray_cluster  # noqa: E402,F401 - the fixture
from upchild import Up, app_yaml, until  # noqa: E402

try:  # the namespaced hosts: another test module's helper, with its fixture
    from nethosts import net_hosts, unavailable  # noqa: E402,F401
except ImportError:  # pragma: no cover - without it, the variant across namespaced hosts skips
    @pytest.fixture
    def net_hosts() -> Any:
        pytest.skip("tests/nethosts.py (namespaced test hosts) is not here")

    def unavailable() -> str | None:
        return "tests/nethosts.py is not here"

# Where namespaced hosts can be made (root, as CI), the variant across them checks everything the one-host
# variant does, each node at an address of its own: the one-host variant runs only where they cannot be made.
ONE_HOST_ONLY = pytest.mark.skipif(unavailable() is None, reason="the variant across namespaced hosts runs "
                                                                 "here and checks the same, address by address")

pytestmark = pytest.mark.slow


def _get(url: str, context: ssl.SSLContext, headers: dict[str, str] | None = None,
         body: bytes | None = None, method: str = "GET") -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=STEP_S, context=context) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _peer_certificate(url: str, context: ssl.SSLContext) -> x509.Certificate:
    """The certificate the server at ``url`` presents (verified against ``context``)."""
    import socket

    parts = urllib.parse.urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    with socket.create_connection((parts.hostname, parts.port), timeout=STEP_S) as raw:
        with context.wrap_socket(raw, server_hostname=parts.hostname) as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def _process_args(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def _process_env(pid: int) -> dict[str, str]:
    items = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
    return dict(item.partition("=")[::2] for item in items if "=" in item)


@ONE_HOST_ONLY
def test_up_on_ray_with_tls_serves_https_on_every_node_verified_against_the_clusters_ca(
        ray_cluster: tuple[Any, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster, _ = ray_cluster
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)  # the "system" context: the system's CAs only
    (tmp_path / "cluster.yaml").write_text(CLUSTER_YAML)
    up = Up(["--engine", "ray", "--address", cluster.address, "--cluster", str(tmp_path / "cluster.yaml"),
             "--no-auto-profile", "--tls"])
    try:
        up.wait_for("Ctrl-C stops everything.", START_S)
        _check_https_everywhere(up)
    finally:
        code = up.stop()
    assert code == 0, "\n".join(up.lines[-40:])


def test_up_on_ray_with_tls_across_namespaced_hosts(net_hosts: Any, tmp_path: Path,  # noqa: F811 - the fixture
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    # Ray's own token authentication is on by default where ~/.ray/auth_token exists, and a worker started
    # by `ray start --address` does not send it: off for this test's cluster (edgemux's own auth and TLS are
    # what is tested)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    hosts = net_hosts(1 + len(NODES))
    head, edges = hosts.hosts[0], dict(zip(NODES, hosts.hosts[1:]))
    ray_bin, address = str(Path(sys.executable).with_name("ray")), f"{head.ip}:{RAY_PORT}"
    temp = Path(tempfile_dir())  # short: Ray's socket paths live under it (a Unix socket path is <108 bytes)
    log = open(tmp_path / "ray.log", "w")  # noqa: SIM115 - closed below
    try:
        hosts.popen(head, [ray_bin, "start", "--head", "--block", "--node-ip-address", head.ip, "--port",
                           str(RAY_PORT), "--num-cpus", "1", "--include-dashboard", "false",
                           "--disable-usage-stats", "--temp-dir", str(temp / "h")], stdout=log,
                    stderr=subprocess.STDOUT)
        # each host a temporary folder of its own, as on separate machines (in one, raylets starting at once
        # race for the same socket and log names)
        for i, (n, h) in enumerate(edges.items()):
            hosts.popen(h, [ray_bin, "start", "--block", "--address", address, "--node-ip-address", h.ip,
                            "--num-cpus", "1", "--resources", json.dumps({node_resource(n): 1}),
                            "--disable-usage-stats", "--temp-dir", str(temp / f"w{i}")], stdout=log,
                        stderr=subprocess.STDOUT)
        # every Ray node joined (read from the head host, as a driver there would)
        waiter = hosts.popen(head, [sys.executable, "-c", _WAIT_FOR_NODES, address, str(1 + len(NODES)),
                                    str(START_S)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out, _ = waiter.communicate(timeout=START_S + 30)
        assert waiter.returncode == 0, out + (tmp_path / "ray.log").read_text()[-3000:]

        (tmp_path / "cluster.yaml").write_text(CLUSTER_YAML)
        up = _UpIn(hosts, head, ["--engine", "ray", "--address", address, "--cluster",
                                 str(tmp_path / "cluster.yaml"), "--no-auto-profile", "--tls"])
        try:
            up.wait_for("Ctrl-C stops everything.", START_S)
            # each process listens on its own host's address: the control plane and the gateway on the head's
            for name in ("controlplane", "gateway"):
                assert urllib.parse.urlsplit(up.field(name)).hostname == head.ip, up.line(name)
            for n, h in edges.items():
                assert urllib.parse.urlsplit(up.field(f"agent {n} ", 2)).hostname == h.ip, up.line(f"agent {n} ")
            _check_https_everywhere(up, others=[h.ip for h in hosts.hosts])
        finally:
            code = up.stop()
        assert code == 0, "\n".join(up.lines[-40:])
    finally:
        log.close()
        import shutil

        shutil.rmtree(temp, ignore_errors=True)


RAY_PORT = 6379
_WAIT_FOR_NODES = """
import sys, time, ray
address, want, timeout_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
ray.init(address=address, log_to_driver=False)
deadline = time.monotonic() + timeout_s
while sum(n["Alive"] for n in ray.nodes()) < want:
    if time.monotonic() > deadline:
        sys.exit(f"only {sum(n['Alive'] for n in ray.nodes())} of {want} Ray nodes joined in {timeout_s:g} s")
    time.sleep(0.5)
"""


def tempfile_dir() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="emxray", dir="/tmp")


class _UpIn(Up):
    """``edgemux up`` (upchild's ``Up``) run inside a namespaced host."""

    def __init__(self, hosts: Any, host: Any, args: list[str]) -> None:
        self.t0 = time.perf_counter()
        self.proc = hosts.popen(host, [sys.executable, "-m", "edgemux", "up", "--ephemeral", *args],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines = []
        self._new = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()


def _check_https_everywhere(up: Up, others: list[str] | None = None) -> None:
    """What both tests check on a started ``up --engine ray --tls`` (module docstring); ``others``: every
    host's address, of which each agent's certificate must name its own and no other's."""
    ca = Path(up.line("TLS:").split("its CA: ")[1].split()[0])
    token = Path(up.field("admin token:", 2)).read_text().strip()
    admin = {"Authorization": f"Bearer {token}"}
    cp, gw = up.field("controlplane"), up.field("gateway")
    agents = {n: up.field(f"agent {n} ", 2) for n in NODES}
    pids = {n: int(up.line(f"agent {n} ").split("(pid ")[1].split()[0]) for n in NODES}
    trusted = ssl.create_default_context(cafile=str(ca))  # the cluster's CA, the only trust anchor
    system = ssl.create_default_context()                 # the system's CAs

    for name, url, path in [("controlplane", cp, "/v1"), ("gateway", gw, "/v2/health/live"),
                            *((f"agent {n}", agents[n], "/v2/health/ready") for n in NODES)]:
        assert url.startswith("https://"), (name, url)
        assert _get(url + path, trusted, admin)[0] == 200, name
        with pytest.raises(urllib.error.URLError) as failed:
            _get(url + path, system, admin)
        assert isinstance(failed.value.reason, ssl.SSLCertVerificationError), (name, failed.value)

    # one certificate per Ray node, naming its address: the agents' differ from one another, the control
    # plane and the gateway (both on the head node) share one
    certs = {n: _peer_certificate(agents[n], trusted) for n in NODES}
    cp_cert, gw_cert = _peer_certificate(cp, trusted), _peer_certificate(gw, trusted)
    assert len({c.serial_number for c in certs.values()} | {cp_cert.serial_number}) == len(NODES) + 1
    assert cp_cert.serial_number == gw_cert.serial_number
    for n, cert in [*certs.items(), ("controlplane", cp_cert)]:
        host = urllib.parse.urlsplit(agents.get(n, cp)).hostname
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = [str(a) for a in san.get_values_for_type(x509.IPAddress)] + san.get_values_for_type(x509.DNSName)
        assert host in names, (n, host, names)
        assert not [o for o in others or [] if o != host and o in names], (n, names)  # no other host's address

    # on the node: the key the agent serves is its owner's only, and it trusts a copy of the CA there
    driver_key = ca.parent / "server.key"
    for n in NODES:
        args = _process_args(pids[n])
        key = Path(args[args.index("--tls-key") + 1])
        assert key != driver_key and key.stat().st_mode & 0o777 == 0o600, (n, key)
        local_ca = Path(_process_env(pids[n])["SSL_CERT_FILE"])
        assert local_ca != ca and local_ca.read_bytes() == ca.read_bytes(), (n, local_ca)

    # the processes speak HTTPS to one another: an app applied is served through the gateway
    status, raw = _get(cp + "/v1/apps", trusted, {**admin, "Content-Type": "application/yaml"},
                       app_yaml("cam-a", "ssd_mobilenet_v2", 10).encode(), "POST")
    assert status < 300, raw[:300]
    key = json.loads(raw)["results"][0]["key"]
    until("cam-a ready", lambda: all(a["status"] == "ready" for a in json.loads(
        _get(cp + "/v1/apps", trusted, admin)[1])["apps"]), STEP_S, every_s=0.2)
    meta = until("cam-a's metadata at the gateway", lambda: (lambda got: json.loads(got[1]) if got[0] == 200
                 else None)(_get(gw + "/v2/models/cam-a", trusted, {"Authorization": f"Bearer {key}"})),
                 STEP_S, every_s=0.2)
    spec = meta["inputs"][0]
    x = np.zeros([1 if d == -1 else d for d in spec["shape"]], DATATYPES[spec["datatype"]])
    body, headers = encode_infer_request({spec["name"]: x})
    assert _get(gw + "/v2/models/cam-a/infer", trusted, {**headers, "Authorization": f"Bearer {key}"}, body,
                "POST")[0] == 200
