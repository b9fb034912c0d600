"""Discrete-event simulator of shared edge devices in virtual time (ms), seeded and deterministic.

* ``arrivals``: Poisson, periodic (random phase) and replayed arrival streams, merged across tenants.
* ``engine``: a lean event heap keyed by (time, priority, sequence).
* ``lindley``: vectorized FCFS with model-switch overhead (numpy, no Python loop per request).
* ``devices``: FCFS, processor sharing, GPU time-sharing, MPS (limited PS) and batching stations.
* ``run``: ``simulate_device`` (replications with confidence intervals) and ``simulate_raw`` (one run).
"""

from edgemux.sim.arrivals import arrival_times, generate_arrivals, merge_streams
from edgemux.sim.engine import Engine
from edgemux.sim.lindley import fcfs_lindley, lindley_waits
from edgemux.sim.run import RawRun, Workload, run_workload, sample_workload, simulate_device, simulate_raw
from edgemux.sim.stats import CI, DeviceSimResult, TenantSimStats, confidence_interval

__all__ = [
    "CI",
    "DeviceSimResult",
    "Engine",
    "RawRun",
    "TenantSimStats",
    "Workload",
    "arrival_times",
    "confidence_interval",
    "fcfs_lindley",
    "generate_arrivals",
    "lindley_waits",
    "merge_streams",
    "run_workload",
    "sample_workload",
    "simulate_device",
    "simulate_raw",
]
