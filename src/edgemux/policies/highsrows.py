"""Sparse constraint rows collected in Python and handed to HiGHS in one ``addRows`` call.

Both MILPs of the policies (``mvsp`` and ``offline``) build their rows term by term; this is the one place
that merges repeated columns, drops zero coefficients and passes CSR arrays to ``highspy``. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import highspy
import numpy as np

__all__ = ["SparseRows"]


class SparseRows:
    """Rows ``lo <= sum a_j x_j <= hi`` waiting to be added to a ``highspy.Highs`` model."""

    def __init__(self) -> None:
        self.lower: list[float] = []
        self.upper: list[float] = []
        self.starts: list[int] = []
        self.index: list[int] = []
        self.value: list[float] = []

    def __len__(self) -> int:
        return len(self.lower)

    def add_terms(self, terms: Iterable[tuple[int, float]], lo: float, hi: float) -> None:
        """One row from (column, coefficient) pairs; a column named twice gets the sum."""
        merged: dict[int, float] = {}
        for j, a in terms:
            merged[j] = merged.get(j, 0.0) + a
        self.starts.append(len(self.index))
        for j, a in merged.items():
            if a != 0.0:
                self.index.append(j)
                self.value.append(a)
        self.lower.append(lo)
        self.upper.append(hi)

    def add(self, cols: Sequence[int], vals: Sequence[float], lo: float, hi: float) -> None:
        """One row from parallel column and coefficient lists."""
        self.add_terms(zip(cols, vals), lo, hi)

    def add_to(self, h: highspy.Highs) -> int:
        """Add the collected rows to ``h`` and keep them (a model may be built more than once); returns
        how many were added."""
        n = len(self.lower)
        if n:
            h.addRows(n, np.array(self.lower, dtype=np.float64), np.array(self.upper, dtype=np.float64),
                      len(self.index), np.array(self.starts, dtype=np.int32), np.array(self.index, dtype=np.int32),
                      np.array(self.value, dtype=np.float64))
        return n

    def flush(self, h: highspy.Highs) -> int:
        """Add the collected rows to ``h`` and forget them (rows added round by round); returns how many."""
        n = self.add_to(h)
        self.__init__()  # type: ignore[misc]
        return n
