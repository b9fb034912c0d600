"""Calibration from end-to-end windows: profiles fitted to what the apps' clients saw, no device-side times.

``adapt.calibrate`` replaces a profile with the service times its devices measured. Many deployments have
no such times (a device that cannot time itself, a runtime that does not say, published data with only
send and answer times); every deployment has each app's windows: how many requests came, how long their
answers took. ``fit_windows`` infers from those each profile's effective service time by fitting the
devices' own estimators (``perf.device.predict_device``, the same prediction admission makes) to the
observed mean latencies at the observed rates.

Model. Each profile ``p`` gets a scale ``theta_p`` on its execution time (mean x theta, variance x
theta^2: its shape kept) and on its switch overhead. For every app placed whole on one device whose window
has at least ``min_samples`` answers, the residual is ``(log predicted_mean(theta) - log observed_mean) /
se``, with ``se`` the relative standard error of the observed mean: ``s / sqrt(n)``, where the relative
spread ``s = (p95 - p50) / (1.645 mean)`` (a normal's, read from the window's percentiles; at least
``MIN_SPREAD``). The prior pulls ``log theta_p`` toward 0 (the profile as it is) with standard deviation
``PRIOR_SD``: with few samples the profile barely moves (shrinkage), with many the data decide. The fit is
a weighted non-linear least squares (scipy's ``least_squares``, bounded to ``[1/8, 8]``); the confidence is
the posterior standard deviation of ``log theta_p`` from the Jacobian at the solution, given as a 95 %
interval on the scale. The latency is end to end, so what lies between the client and the device (the
network the placement knows, the serving path it does not) is folded into the effective service time: it
is the figure that predicts what the clients will see.

Left out: apps split over several devices (their window mixes the devices) and apps with a CPU stage (the
stage's own time would be scaled with the device's). Pure: windows, snapshot and catalog in, profiles out.
Units: ms, req/s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from edgemux.adapt.monitor import AppWindow
from edgemux.perf.device import predict_device
from edgemux.perf.result import Unstable
from edgemux.policies.base import Snapshot, device_spec
from edgemux.profiles.catalog import Catalog
from edgemux.profiles.types import ExecTime, Profile, Provenance

__all__ = ["FITTED", "PRIOR_SD", "Fitted", "fit_windows"]

FITTED = "fitted"      # provenance source of a profile fitted from end-to-end windows
PRIOR_SD = 0.25        # prior standard deviation of log(theta): the catalog within about +-50 % at 95 %
MIN_SPREAD = 0.05      # the least relative spread of one latency assumed (a window of identical answers)
_BOUNDS = (math.log(1 / 8), math.log(8))


@dataclass(frozen=True)
class Fitted:
    """One profile's fit: the scale on its execution time and switch (``theta``), the 95 % interval of the
    scale, the answered requests and apps it rests on, and the calibrated profile."""

    profile: Profile
    theta: float
    low: float
    high: float
    requests: int
    apps: tuple[str, ...]


def _scaled(base: Profile, theta: float, low: float, high: float, requests: int, apps: tuple[str, ...]) -> Profile:
    """``base`` with its execution time and switch scaled by ``theta``, its provenance saying how it was fitted
    (``low``-``high``: the scale's 95 % interval; ``requests`` of ``apps`` the answers it rests on)."""
    e = base.exec_time(1)
    exec_ = dict(base.exec)
    exec_[1] = ExecTime(1, e.mean_ms * theta, e.var_ms2 * theta * theta)
    detail = (f"execution {e.mean_ms * theta:.3g} ms (x{theta:.3f}, 95 % x{low:.3f}-x{high:.3f}) fitted to the "
              f"end-to-end latency of {requests} requests of {', '.join(apps)}")
    said = f"catalog: {e.mean_ms:.3g} ms, switch {base.switch_ms:.3g} ms"
    return replace(base, exec=exec_, switch_ms=base.switch_ms * theta,
                   provenance=Provenance(FITTED, detail, f"{said}, {base.provenance.source}"))


def fit_windows(snapshot: Snapshot, windows: Mapping[str, AppWindow], base: Catalog, *, min_samples: int,
                skip: frozenset[str] = frozenset()) -> dict[str, Fitted]:
    """Per profile (name), its fit to this window's end-to-end latencies (module doc), for the profiles of
    every app placed whole on one device with at least ``min_samples`` answers and no CPU stage; ``base``:
    the catalog the scales apply to (and the prior's centre); ``skip``: profiles not to fit (calibrated from
    device-side times already). Empty when nothing can be fitted."""
    from scipy.optimize import least_squares

    apps: dict[str, tuple[str, str, float, float, int]] = {}  # app -> (device, profile, mean, se, answers)
    rated = dict(snapshot.apps)
    for name, app in snapshot.apps.items():
        placement = snapshot.placements.get(name)
        w = windows.get(name)
        if placement is None or w is None or w.latency is None or len(placement.shares) != 1:
            continue
        lat = w.latency
        share = placement.shares[0]
        if lat.count < min_samples or share.profile in skip or share.profile not in base.profiles:
            continue
        if app.cpu_ms > 0 or not lat.mean_ms > 0:
            continue
        spread = max(MIN_SPREAD, (lat.p95_ms - lat.p50_ms) / (1.645 * lat.mean_ms))
        apps[name] = (share.device, share.profile, lat.mean_ms, spread / math.sqrt(lat.count), lat.count)
        rated[name] = replace(app, rate_rps=w.rate_rps)
    if not apps:
        return {}
    names = sorted({v[1] for v in apps.values()})
    devices = sorted({v[0] for v in apps.values()})
    where = {n: i for i, n in enumerate(names)}
    order = sorted(apps)
    bases = {n: base.get(n) for n in names}
    # only the apps that share a fitted device: the fit evaluates the estimators many times, and the rest
    # of the cluster does not change them
    here = {a: p for a, p in snapshot.placements.items() if any(s.device in devices for s in p.shares)}
    here_apps = {a: rated[a] for a in here}

    def predicted(x: np.ndarray) -> np.ndarray:
        theta = np.exp(x)
        catalog = base.with_profiles([_scaled(bases[n], float(theta[where[n]]), 0.0, 0.0, 0, ()) for n in names])
        snap = Snapshot(snapshot.cluster, here_apps, here, catalog)
        loads = snap.device_loads
        out = {}
        for path in devices:
            # the fit reads means only: no tails (they cost most of an estimate)
            est = predict_device(device_spec(snap.cluster.devices[path]), list(loads[path].tenants), tails=())
            for a in loads[path].apps:
                if a in apps:
                    m = est[a].mean_ms
                    out[a] = math.inf if isinstance(m, Unstable) else float(m)
        return np.array([out[a] for a in order])

    observed = np.log([apps[a][2] for a in order])
    se = np.array([apps[a][3] for a in order])

    def residuals(x: np.ndarray) -> np.ndarray:
        pred = predicted(x)
        # an overloaded prediction is as far as the bounds allow: the fit moves away from it
        logp = np.where(np.isfinite(pred), np.log(np.where(pred > 0, pred, 1.0)), observed + 10.0)
        return np.concatenate([(logp - observed) / se, x / PRIOR_SD])

    sol = least_squares(residuals, np.zeros(len(names)), bounds=_BOUNDS, x_scale=1.0, diff_step=1e-4)
    jac = sol.jac
    try:
        cov = np.linalg.inv(jac.T @ jac)
    except np.linalg.LinAlgError:
        cov = np.diag(np.full(len(names), PRIOR_SD ** 2))
    out: dict[str, Fitted] = {}
    for n in names:
        i = where[n]
        sd = math.sqrt(max(float(cov[i, i]), 0.0))
        theta = math.exp(float(sol.x[i]))
        low, high = math.exp(float(sol.x[i]) - 1.96 * sd), math.exp(float(sol.x[i]) + 1.96 * sd)
        used = tuple(a for a in order if apps[a][1] == n)
        requests = sum(apps[a][4] for a in used)
        out[n] = Fitted(_scaled(bases[n], theta, low, high, requests, used), theta, low, high, requests, used)
    return out
