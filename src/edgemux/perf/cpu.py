"""Per-app CPU stage (Ibis §3.5, Eq. 11): an M/G/c processor-sharing queue per app.

Each app runs in its own container with ``cores`` of CPU (possibly fractional); its requests share them by
OS time-sharing, each needing ``service`` ms of one core. With n requests present each progresses at rate
``min(1, c/n)`` (limited processor sharing; a lone request cannot use more than one core, and with
``c < 1`` it runs at rate c). The mean is insensitive to the service-time distribution beyond its mean.

Two forms: the exact mean of that model (:func:`cpu_response`) and Ibis Eq. 11 as printed,
``E[R] = c / (c mu - lam)`` (:func:`ibis_cpu_response`), which overestimates for ``c > 1`` (by
``1 + rho (c - 1)`` for ``1 < c <= 2``: c = 2, rho = 0.5 gives +50 %) and underestimates by the factor c
for ``c < 1``.

Units: ms, req/s. Pure functions.
"""

from __future__ import annotations

from edgemux.cluster.workload import CpuStage
from edgemux.perf.queueing import ibis_mgc_ps_response, limited_ps_response, utilization
from edgemux.perf.result import Latency

__all__ = ["cpu_utilization", "cpu_response", "ibis_cpu_response"]


def _check(stage: CpuStage) -> None:
    if not stage.cores > 0:
        raise ValueError(f"a CPU stage needs cores > 0, got {stage.cores}")


def cpu_utilization(stage: CpuStage, rate_rps: float) -> float:
    """Utilization of the app's cores ``rho = lam E[S] / c`` (dimensionless), Ibis Eq. 11's rho."""
    _check(stage)
    return utilization(rate_rps, stage.service.mean, stage.cores)


def cpu_response(stage: CpuStage, rate_rps: float, *, where: str = "cpu") -> Latency:
    """Exact mean CPU-stage response time (ms) of M/G/c limited PS with ``c = stage.cores``: the model of
    Ibis Eq. 11 solved exactly (``perf.queueing.limited_ps_response``). ``Unstable`` when rho >= 1."""
    _check(stage)
    return limited_ps_response(rate_rps, stage.service.mean, stage.cores, where=where)


def ibis_cpu_response(stage: CpuStage, rate_rps: float, *, where: str = "cpu") -> Latency:
    """Ibis Eq. 11 as printed: ``E[R] = c / (c mu - lam)`` (ms), ``c = stage.cores``, ``mu = 1/E[S]``."""
    _check(stage)
    return ibis_mgc_ps_response(rate_rps, stage.service.mean, stage.cores, where=where)
