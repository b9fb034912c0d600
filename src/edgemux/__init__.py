"""edgemux: SLO-aware multi-tenant DNN inference on shared edge accelerators.

Units used across the package unless a name says otherwise: times in milliseconds (``*_ms``),
rates in requests per second (``*_rps``), memory in megabytes (``*_mb``), power in watts.
"""

__version__ = "0.1.0"
