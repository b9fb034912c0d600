"""An agent's lease from the control plane, and the fencing it implies (docs/multihost.md, "Fencing").

A partition is not a death: a node whose link dropped keeps running, still holding its apps, while the
control plane declares it lost and places those apps elsewhere. Without a rule, the node would go on serving
whoever can still reach it beside the new placement (two placements, two token buckets admitting one contract
twice). The rule here is the node lease of Chubby and Kubernetes, kept by the agent itself:

- **The lease.** The agent asks for ``lease_s`` in every register/heartbeat (``--lease-s``, default
  ``DEFAULT_LEASE_HEARTBEATS`` heartbeats); a control plane that keeps leases grants it in its answer
  (``"lease_s"``). Each acknowledged message renews the lease **from the instant the agent sent it**: the
  control plane stamps the same message later (when it arrives), so on the agent's side the lease always ends
  first.
- **Fenced.** With no acknowledged message for longer than the granted lease, every inference request for
  the apps it holds is answered 503 naming the reason (``Fenced``), counted; its models stay loaded.
- **Lost.** The control plane declares the node lost (routes, evacuation) only after lease + margin since
  the message it last received (``controlplane.reconciler.lost_after_s``), when the lease has surely run out
  here; so an app is never served from here after it is served elsewhere.
- **Return.** The first answer after a lapsed lease renews it, but unfences only the apps that answer places
  here (``"apps"``: the store's target for the node) or that the control plane PUT here since that message
  was sent; the others stay fenced ("no longer placed here") until the reconcile pass that follows deletes
  them (or PUTs them again). So a returning agent never serves an app the store moved away.

Without a grant (no control plane, ``--lease-s 0``, or a control plane that keeps no leases) nothing is
fenced. Normal answers that do not list an app the agent holds (a move draining it away) fence nothing: only
a lapsed lease makes an answer's list binding.

Units: ``*_s`` seconds; times are ``clock()`` readings (monotonic, s).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["DEFAULT_LEASE_HEARTBEATS", "Lease", "check_lease_s"]

logger = logging.getLogger("edgemux.agent")

DEFAULT_LEASE_HEARTBEATS = 3.0  # the default lease: three heartbeat periods, two heartbeats may be lost


def check_lease_s(lease_s: float, heartbeat_s: float) -> str | None:
    """Why ``lease_s`` is not a lease for heartbeats every ``heartbeat_s`` (None: it is): 0 (no fencing) or
    a finite number of seconds above one heartbeat period (a shorter lease would lapse between heartbeats)."""
    if isinstance(lease_s, bool) or not isinstance(lease_s, (int, float)) or not math.isfinite(lease_s) \
            or lease_s < 0:
        return f"must be 0 (no fencing) or a finite number of seconds, got {lease_s!r}"
    if 0 < lease_s <= heartbeat_s:
        return (f"must exceed the heartbeat period ({heartbeat_s:g} s), got {lease_s:g}: the lease would lapse "
                "between two heartbeats (0: no fencing)")
    return None


class Lease:
    """The agent's lease (module doc): ``lease_s`` asked for (0: never fenced); ``clock`` (s, monotonic).

    ``granted_s`` is the control plane's grant in its last answer (None: no lease held, nothing fenced);
    ``renewed_at`` when the last acknowledged message was sent; ``unconfirmed`` the held apps the answer
    after a lapsed lease did not place here (app -> the reason they stay fenced); ``lapses`` how many times
    the lease was found to have run out when an answer came back. Thread-safe (the control API registers
    apps on worker threads)."""

    def __init__(self, lease_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.lease_s = float(lease_s)
        self.clock = clock
        self.granted_s: float | None = None
        self.renewed_at: float | None = None
        self.unconfirmed: dict[str, str] = {}
        self.lapses = 0
        self._placed_at: dict[str, float] = {}  # app -> when the control plane last PUT it here
        self._lock = threading.Lock()

    # -- what the request path asks ------------------------------------------------------------------

    def silent_s(self) -> float | None:
        """Seconds since the last acknowledged message was sent (None: none yet)."""
        renewed = self.renewed_at
        return None if renewed is None else self.clock() - renewed

    def lapsed(self) -> str:
        """Why the whole agent is fenced ("" when it is not): the granted lease ran out."""
        granted, renewed = self.granted_s, self.renewed_at
        if granted is None or renewed is None:  # no lease held: no clock read on the request path
            return ""
        silent = self.clock() - renewed
        if silent <= granted:
            return ""
        return f"fenced: no word from the control plane for {silent:.1f} s > lease {granted:g} s"

    def why(self, app: str) -> str:
        """Why requests for ``app`` are refused here ("" when it may be served): the lease ran out, or the
        answer after a lapsed lease did not place it here."""
        return self.lapsed() or self.unconfirmed.get(app, "")

    # -- what the control-plane link and the control API tell it ----------------------------------------

    def acknowledged(self, sent_at: float, answer: Any, held: Iterable[str]) -> None:
        """The control plane acknowledged the register/heartbeat sent at ``sent_at`` (clock s) with
        ``answer`` (its JSON body); ``held`` are the apps the agent holds now. Renews (or drops) the lease;
        after a lapsed lease, fences the held apps the answer does not place here (module doc)."""
        doc = answer if isinstance(answer, dict) else {}
        grant = doc.get("lease_s")
        granted = float(grant) if isinstance(grant, (int, float)) and not isinstance(grant, bool) \
            and math.isfinite(grant) and grant > 0 and self.lease_s > 0 else None
        apps = doc.get("apps")
        placed = {a for a in apps if isinstance(a, str)} if isinstance(apps, list) else None
        with self._lock:
            lapsed = bool(self.lapsed())
            self.granted_s = granted
            self.renewed_at = sent_at if self.renewed_at is None else max(self.renewed_at, sent_at)
            if granted is None:  # no lease kept: nothing is fenced
                self.unconfirmed.clear()
                return
            if placed is not None:  # an answer that places an app here confirms it
                for app in placed:
                    self.unconfirmed.pop(app, None)
            if not lapsed:
                return
            self.lapses += 1
            for app in sorted(set(held)):
                if (placed is None or app not in placed) and self._placed_at.get(app, -math.inf) < sent_at:
                    self.unconfirmed[app] = (f"fenced: app '{app}' is held here but the control plane no longer "
                                             "places it here (its answer after the lease lapsed); it is being "
                                             "removed")
        kept = sorted(self.unconfirmed)
        logger.warning("control plane answered again after the lease lapsed: unfenced%s",
                       f"; still fenced (no longer placed here): {', '.join(kept)}" if kept else " every app")

    def placed(self, app: str, at: float | None = None) -> None:
        """The control plane PUT ``app`` here at ``at`` (clock s; default now): it places the app here."""
        with self._lock:
            self._placed_at[app] = self.clock() if at is None else at
            self.unconfirmed.pop(app, None)

    def removed(self, app: str) -> None:
        """``app`` was deleted here."""
        with self._lock:
            self._placed_at.pop(app, None)
            self.unconfirmed.pop(app, None)

    def to_json(self) -> dict[str, Any]:
        """The lease as ``GET /v1/node`` shows it."""
        silent = self.silent_s()
        return {"lease_s": self.lease_s, "granted_s": self.granted_s,
                "silent_s": None if silent is None else round(silent, 3), "fenced": self.lapsed() or None,
                "unconfirmed": sorted(self.unconfirmed), "lapses": self.lapses}
