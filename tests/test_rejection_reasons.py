"""A rejection leads with the constraint that decided it: what broke on the device where the app came closest,
with its numbers (utilization after placement against the cap; the tenant whose SLO would break, predicted
against target; what is needed against what is free), and it carries every device's reason as data, in
``edgemux place --explain`` and ``--json`` and in the control plane's apply answer.

The two cases of the examples: ``cam-hd`` (examples/local/apps.yaml, a 50 FPS camera no Edge TPU can carry)
and ``cam-dock`` (examples/cluster/apps.yaml, which would push ``cam-entrance``'s p99 past its SLO)."""

from __future__ import annotations

import json
import random
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from conftest import EXAMPLES
from edgemux import policies
from edgemux.cli.main import main
from edgemux.cluster.specs import load_apps, load_cluster
from edgemux.perf.device import device_utilization
from edgemux.policies import Reason, Rejection, Snapshot
from edgemux.policies.base import closest, device_spec, ranked, resolve_profile, tenant_for
from support import LoopThread
from test_policies_screen import LoopIbis, app as random_app, cluster as random_cluster

CLUSTER = EXAMPLES / "cluster" / "cluster.yaml"
APPS = EXAMPLES / "cluster" / "apps.yaml"
LOCAL = EXAMPLES / "local" / "cluster.yaml"

# examples/local/apps.yaml without the two apps whose models only the cpu profile sets `edgemux up` measures
# have (cpu-squeeze, classify-lite): the others, cam-hd last, as that file declares them
LOCAL_APPS = """\
apiVersion: edgemux/v1alpha1
kind: AppList
metadata: {name: local-demo}
spec:
  apps:
    - {name: cam-entrance, model: ssd_mobilenet_v2, fps: 15, slo: {latencyMs: 66.7, stat: p99}}
    - {name: detect-people, model: yolov4_tiny, rate: 5, burst: 10, slo: {latencyMs: 150, stat: mean}}
    - {name: classify, model: mobilenet_v2, rate: 20, burst: 40, slo: {latencyMs: 50, stat: p95}}
    - {name: cam-hd, model: ssd_mobilenet_v2, fps: 50, slo: {latencyMs: 40, stat: p99}}
"""


def admit(cluster_path: Path, apps_path: Path, policy: str) -> tuple[Snapshot, dict[str, Rejection]]:
    """The apps admitted in file order; the snapshot before the last rejection of each rejected app."""
    pol = policies.get(policy)
    snap = Snapshot(load_cluster(cluster_path))
    rejected: dict[str, Rejection] = {}
    for a in load_apps(apps_path):
        d = pol.decide(a, snap)
        if isinstance(d, Rejection):
            rejected[a.name] = d
        else:
            snap = snap.with_placement(a, d)
    return snap, rejected


@pytest.fixture
def local_apps(tmp_path: Path) -> Path:
    p = tmp_path / "apps.yaml"
    p.write_text(LOCAL_APPS, encoding="utf-8")
    return p


def test_cam_hd_leads_with_utilization_on_the_closest_tpu(local_apps: Path) -> None:
    snap, rejected = admit(LOCAL, local_apps, "edgemux")
    r = rejected["cam-hd"]
    kinds = {x.device: x.kind for x in r.reasons}
    assert kinds == {"edge-1/tpu0": "utilization", "edge-1/gpu0": "no-profile", "edge-2/tpu0": "utilization",
                     "cpu-1/cpu0": "no-profile"}
    tpus = [x for x in r.reasons if x.kind == "utilization"]
    best = min(tpus, key=lambda x: x.predicted or 0.0)
    # the closest is the Edge TPU with the lower utilization after placement, not a device without a profile
    assert (r.constraint, r.device) == ("utilization", best.device) and r.reason.device == best.device
    for x in tpus:
        # the numbers are the estimators': the device's tenants plus cam-hd, against the 0.9 cap
        dev = snap.cluster.devices[x.device]
        app = next(a for a in load_apps(local_apps) if a.name == "cam-hd")
        profile = resolve_profile(app, dev, snap.catalog)
        assert profile is not None
        new = tenant_for(app, profile, serving_ms=dev.serving_ms)
        rho = device_utilization(device_spec(dev), [*snap.tenants(dev), new])
        assert x.predicted == pytest.approx(rho, rel=1e-9) and x.limit == 0.9 and x.ratio == pytest.approx(rho / 0.9)
    assert r.message.startswith(f"app 'cam-hd' rejected: utilization {best.predicted:.2f} > 0.90 on {best.device}; "
                                "0/4 devices fit (2 no-profile, 2 utilization)")


def test_cam_dock_names_the_tenant_whose_slo_breaks() -> None:
    snap, rejected = admit(CLUSTER, APPS, "ibis")
    r = rejected["cam-dock"]
    entrance = snap.apps["cam-entrance"]
    assert (r.constraint, r.device, r.tenant, r.stat, r.slo_ms) == ("slo", "node-2/tpu0", "cam-entrance", "p99",
                                                                   entrance.slo.latency_ms)
    assert r.predicted_ms is not None and r.predicted_ms > r.slo_ms
    assert r.message.startswith(f"app 'cam-dock' rejected: slo: cam-entrance would see p99 {r.predicted_ms:.1f} ms "
                                f"> {entrance.slo.latency_ms:g} ms on node-2/tpu0; 0/4 devices fit (3 no-profile, 1 slo)")
    (slo,) = [x for x in r.reasons if x.kind == "slo"]
    assert slo == r.reason == Reason("slo", "node-2/tpu0", None, "cam-entrance", "p99", r.predicted_ms,
                                     entrance.slo.latency_ms, "ms")
    assert sorted(x.kind for x in r.reasons) == ["no-profile"] * 3 + ["slo"]
    assert ranked(r.reasons)[0] == slo     # a device without a profile comes last


def test_closest_ranks_by_relative_violation_then_numberless_then_no_profile() -> None:
    reasons = [Reason("no-profile", "d0"), Reason("occupied", "d1"),
               Reason("device-memory", "d2", predicted=6.0, limit=2.0, unit="MB"),       # x3
               Reason("slo", "d3", tenant="a", stat="p95", predicted=110.0, limit=100.0, unit="ms"),  # x1.1
               Reason("utilization", "d4", predicted=1.2, limit=0.9, unit="(rho)")]       # x1.33
    assert [x.device for x in ranked(reasons)] == ["d3", "d4", "d2", "d1", "d0"]
    assert closest(reasons) == 3 and closest(reasons[:2]) == 1 and closest(reasons[:1]) == 0
    # nothing free: infinitely far; an unstable queue too, and said so
    assert Reason("device-memory", "d", predicted=1.0, limit=0.0).ratio == float("inf")
    unstable = Reason("slo", "d", tenant="a", stat="p99", predicted=float("inf"), limit=50.0, unit="ms")
    assert unstable.text == "slo: a would see an unstable queue (p99 unbounded > 50 ms) on d"
    assert unstable.to_json()["predicted"] == "unstable" and "ratio" not in unstable.to_json()


def test_place_explain_and_json_carry_every_devices_reason(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["place", "--cluster", str(CLUSTER), "--apps", str(APPS), "--policy", "ibis"]
    assert main(base + ["--explain"]) == 0
    out = capsys.readouterr().out
    _, rejected = admit(CLUSTER, APPS, "ibis")
    headline = rejected["cam-dock"].reason.what
    assert rejected["cam-dock"].message in out
    table = out.split("device by device (closest first):\n", 1)[1].splitlines()
    assert table[2].split(None, 2) == ["cam-dock", "node-2/tpu0", headline]
    assert [ln.split()[1:] for ln in table[3:]] == [["node-1/tpu0", "no-profile"], ["node-1/gpu0", "no-profile"],
                                                  ["node-2/gpu0", "no-profile"]]
    assert main(base + ["--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rej = next(d for d in doc["decisions"] if d["app"] == "cam-dock")["rejection"]
    assert [x["kind"] for x in rej["reasons"]] == ["no-profile", "no-profile", "no-profile", "slo"]
    slo = rej["reasons"][3]
    assert {k: slo[k] for k in ("kind", "device", "tenant", "stat", "unit", "limit")} == {
        "kind": "slo", "device": "node-2/tpu0", "tenant": "cam-entrance", "stat": "p99", "unit": "ms", "limit": 66.7}
    assert slo["predicted"] == pytest.approx(rej["predicted_ms"]) and slo["ratio"] == pytest.approx(
        rej["predicted_ms"] / 66.7, rel=1e-5)
    assert rej["constraint"] == "slo" and rej["tenant"] == "cam-entrance"


APP = ("apiVersion: edgemux/v1alpha1\nkind: App\nmetadata: {{name: {name}}}\n"
       "spec: {{model: {model}, fps: {fps}, slo: {{latencyMs: {slo}, stat: {stat}}}}}\n")


def _post(url: str, body: bytes) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/yaml"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_apply_answer_carries_the_reasons(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from edgemux.runtime.controlplane.api import start_server
    from edgemux.runtime.controlplane.service import ControlPlane

    loop = LoopThread()
    cp = ControlPlane(str(tmp_path / "store.db"), load_cluster(CLUSTER), "edgemux", {})
    server = loop.run(start_server(cp, "127.0.0.1", 0))
    try:
        # cam-entrance first (no agent is registered: it is admitted, its piece pending), then cam-dock beside it,
        # as examples/cluster/apps.yaml declares them
        apps = {a.name: a for a in load_apps(APPS)}
        entrance, dock = tmp_path / "entrance.yaml", tmp_path / "dock.yaml"
        entrance.write_text(APP.format(name="cam-entrance", model="ssd_mobilenet_v2", fps=15, stat="p99",
                                       slo=apps["cam-entrance"].slo.latency_ms), encoding="utf-8")
        dock.write_text(APP.format(name="cam-dock", model="bodypix", fps=5, stat="p95",
                                   slo=apps["cam-dock"].slo.latency_ms), encoding="utf-8")
        status, body = _post(f"{server.url}/v1/apps", entrance.read_bytes())
        assert status == 201 and body["results"][0]["placement"]["shares"][0]["device"] == "node-2/tpu0", body
        status, body = _post(f"{server.url}/v1/apps", dock.read_bytes())
        assert status == 409
        rej = body["results"][0]["rejection"]
        assert rej == body["rejection"]
        assert rej["constraint"] == "slo" and rej["tenant"] == "cam-entrance" and rej["device"] == "node-2/tpu0"
        assert rej["headline"].startswith("slo: cam-entrance would see p99 ") and rej["headline"] in rej["message"]
        assert rej["message"].startswith("app 'cam-dock' rejected: " + rej["headline"])
        assert [x["kind"] for x in rej["reasons"]] == ["no-profile", "no-profile", "no-profile", "slo"]
        slo = rej["reasons"][3]
        assert slo["tenant"] == "cam-entrance" and slo["stat"] == "p99" and slo["unit"] == "ms"
        assert slo["predicted"] == pytest.approx(rej["predicted_ms"]) and slo["limit"] == 66.7
        # edgemux apply: the headline in the table, the message on stderr, exit 1
        assert main(["apply", "-f", str(dock), "--server", server.url]) == 1
        out, err = capsys.readouterr()
        row = next(ln for ln in out.splitlines() if ln.startswith("cam-dock"))
        assert row.split(None, 3)[1:] == ["rejected", "-", rej["headline"]]
        assert err.strip() == f"edgemux: {rej['message']}"
    finally:
        loop.run(server.stop())
        loop.stop()


@pytest.mark.slow   # a few seconds: the device-by-device reference decides each app too
def test_screened_reasons_agree_with_the_device_by_device_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """The screens' reasons (numbers from the snapshot's aggregates, and for a latency failure a screen only
    knows as such, the means) are those the per-device checks give, up to rounding, and they pick the same
    closest device; some latency failures here come from the screens (``Pending``). ``edgemux`` reports
    through the same ``Ibis._summarize``."""
    from edgemux.policies import feasibility

    monkeypatch.setattr(feasibility, "_SCREEN_MIN", 1)   # the time-sharing screen on this small cluster too
    pending = {"n": 0}
    from edgemux.policies import ibis as ibis_module
    real = ibis_module.pending_reason

    def counting(*args: Any) -> Reason:
        pending["n"] += 1
        return real(*args)

    monkeypatch.setattr(ibis_module, "pending_reason", counting)
    rng = random.Random(7)
    s = Snapshot(random_cluster(rng))
    fast, slow = policies.get("ibis"), LoopIbis()
    seen: set[str] = set()
    for i in range(24):
        a = random_app(rng, i, (20.0, 300.0), 80.0)
        d_fast, d_slow = fast.decide(a, s), slow.decide(a, s)
        assert d_fast == d_slow, (i, a)
        if not isinstance(d_fast, Rejection):
            s = s.with_placement(a, d_fast)
            continue
        assert isinstance(d_slow, Rejection)
        assert len(d_fast.reasons) == len(d_slow.reasons) == len(s.cluster.devices)
        for x, y in zip(d_fast.reasons, d_slow.reasons):
            assert (x.kind, x.device, x.node, x.tenant, x.stat, x.unit) == \
                (y.kind, y.device, y.node, y.tenant, y.stat, y.unit)
            assert (x.predicted is None) == (y.predicted is None) and (x.limit is None) == (y.limit is None)
            if x.predicted is not None:
                assert x.predicted == pytest.approx(y.predicted, rel=1e-9)
                assert x.limit == pytest.approx(y.limit, rel=1e-9)
            seen.add(x.kind)
        first = d_fast.reasons[closest(d_fast.reasons)]
        assert (first.kind, first.device) == (d_fast.constraint, d_fast.device)
    assert {"no-profile", "utilization", "slo"} <= seen and pending["n"] > 0, (seen, pending)
