"""Estimators: analytic latency models of shared edge accelerators. Pure functions (no I/O, no clocks,
no randomness); times in ms, rates in req/s.

- ``queueing``: M/G/1-FCFS (P-K), M/D/1, M/M/1, multi-class M/G/1-PS, exact M/G/c limited PS, Ibis Eq. 10/11
- ``edgetpu``: Edge TPU with model-switch overhead (Ibis Eq. 1-5, true mixture second moment)
- ``gpu``: GPU time sharing (FCFS/PS bounds, Eq. 6-8, per-app estimate), MPS (Eq. 10), batching (Eq. 9)
- ``cpu``, ``tandem``: per-app CPU stage (Eq. 11) and end-to-end sums (Ibis §3.6)
- ``tails``: p95/p99 of M/G/1-FCFS devices by numerical Pollaczek-Khinchine inversion
- ``interference``: MVSP linear interference (Eq. 3, 14) and network path latency (Eq. 2)
- ``dutycycle``: MicroEdge TPU units; ``energy``: FPGA-GPU time, throughput and energy (Eq. 1-3)
- ``device``: ``predict_device`` / ``device_utilization``, the bridge used by the CLI and policies
- ``paper_forms``: the papers' own formulas where edgemux uses exact ones, for reports
- ``result``: ``Unstable`` and ``Latency``; ``slo``: verdicts against an SLO
"""
