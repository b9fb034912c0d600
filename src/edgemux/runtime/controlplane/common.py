"""What the control plane's managers share: the error an API call answers with (:class:`ControlPlaneError`) and
the text and JSON helpers of their answers and logs (``clip``, ``describe_exc`` and ``quote`` are the servers'
shared ones from ``runtime.httputil``).

Units: none (text).
"""

from __future__ import annotations

import math
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

from edgemux.cluster.state import Placement
from edgemux.errors import EdgemuxError, InputError
from edgemux.policies import Rejection
from edgemux.runtime.controlplane.messages import RejectionView
from edgemux.runtime.dataplane.protocol import short_repr
from edgemux.runtime.httputil import clip, describe_exc, quote  # re-exported: the managers' one import

__all__ = ["ControlPlaneError", "check_url", "clip", "describe_exc", "listing", "num", "quote", "rejection_json",
           "rejection_view", "shares_text"]


class ControlPlaneError(EdgemuxError):
    """A request the control plane refuses; ``status`` is the HTTP status."""

    def __init__(self, message: str, status: int = 400, extra: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.extra = dict(extra or {})


def num(x: Any) -> Any:
    """A number for JSON: non-finite (an unstable queue) becomes the string ``"unstable"``."""
    if isinstance(x, float) and not math.isfinite(x):
        return "unstable"
    if x is not None and not isinstance(x, (int, float, str, bool)):  # perf's Unstable marker
        return "unstable"
    return x


def rejection_json(r: Rejection) -> dict[str, Any]:
    """A rejection as plain data: constraint, message and the numbers that are set."""
    d: dict[str, Any] = {"app": r.app, "constraint": r.constraint, "message": r.message}
    for k in ("device", "node", "requested", "used", "capacity", "unit", "tenant", "predicted_ms", "slo_ms",
              "stat", "detail"):
        v = getattr(r, k)
        if v is not None and v != "":
            d[k] = num(v)
    if r.counts:
        d["counts"] = dict(r.counts)
    return d


def rejection_view(r: Rejection) -> RejectionView:
    """A rejection as its typed message."""
    d = rejection_json(r)
    return RejectionView(d.pop("constraint"), d.pop("message"), d)


def shares_text(p: Placement) -> str:
    """A placement's shares in one line (``node/dev x0.7, ...``; a spatial share says its instances)."""
    return ", ".join(f"{s.device} x{s.weight:.3g}" + (f" ({s.instances} x {s.fraction:.3g} of it)"
                                                      if (s.fraction, s.instances) != (1.0, 1) else "")
                     for s in p.shares)


def check_url(url: Any, field_name: str, exc: type[Exception] = InputError) -> str:
    """``url`` as an ``http(s)://HOST:PORT`` base without a trailing slash; ``exc`` (``InputError`` naming
    ``field_name``, or ``ControlPlaneError`` 400) otherwise."""
    if isinstance(url, str):
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme in ("http", "https") and parsed.netloc and len(url) <= 2048:
            return url.rstrip("/")
    message = f"expected an http://HOST:PORT URL, got {short_repr(url)}"
    if exc is InputError:
        raise InputError(field_name, message)
    raise ControlPlaneError(f"'{field_name}': {message}")


def listing(names: Iterable[str]) -> str:
    """At most a dozen names in one line (``none`` for none), for an error that says what exists."""
    items = list(names)
    return (", ".join(items[:12]) + (", ..." if len(items) > 12 else "")) or "none"
