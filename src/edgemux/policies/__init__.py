"""Admission and placement policies behind one interface (:mod:`edgemux.policies.base`), by name:
``knapsack``, ``dedicated``, ``ibis``, ``microedge``, ``edgemux``. Pure: no I/O, clocks or randomness."""

from edgemux.policies.base import Decision, Policy, Reason, Rejection, Snapshot
from edgemux.policies.registry import get, names, register

__all__ = ["Decision", "Policy", "Reason", "Rejection", "Snapshot", "get", "names", "register"]
