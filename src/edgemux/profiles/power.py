"""Power figures of accelerators, read from ``data/power.yaml`` with their sources.

:func:`kim_testbed` gives the accelerators of Kim et al.'s FPGA-GPU testbed (papers/004 §4: 4 RTX 3080, 2 RTX
2080 Super, 2 Alveo U200) as :class:`AcceleratorSpec` values: Eq. 1's ``alpha`` and ``beta`` per card, Q(C),
memory's largest batch, idle and full-load power. The paper prints none of these; the file holds the published
figures that exist and says which numbers are assumptions. How each law is derived:

* a GeForce card: the batch-law shape ``T(bs) = a*bs + b`` measured by this repo on a GPU (``gpu_batch_law``:
  T at batch 1 and 32) scaled so that T(1) is the card's published batch-1 time (or, for a card with no
  published figure, the reference card's over an assumed ``speed``): alpha = k*a, beta = k*b, k = T_card(1)/T(1);
* an FPGA: alpha = 1000 / its published peak throughput (ms per request at large batches) and beta = its
  published batch-1 latency - alpha.

:func:`edge_node` gives an edge node type's power figures (host and accelerator idle, accelerator active,
switched off, wake-up time) for consolidation; ``cluster.power.NodePower`` is built from them per node, and
:func:`node_wake_s` gives the running control plane each node's wake-up time from its device kinds.

Units: ms, W, req/s, s. Pure reading, no I/O beyond the package's own data file.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml

POWER_FILE = "power.yaml"


class PowerDataError(ValueError):
    """``power.yaml`` holds something the loader cannot use; the message names the entry and the field."""


@dataclass(frozen=True)
class AcceleratorSpec:
    """One card type of a testbed: ``count`` of them; Eq. 1's ``alpha_ms`` (per request) and ``beta_ms`` (per
    batch); ``max_batch`` one worker's largest batch; ``slowdown`` Q(C) per allowed worker count; ``idle_w``
    and ``max_w`` its idle and full-load power (W); ``sources`` says where each came from."""

    name: str
    kind: str
    count: int
    alpha_ms: float
    beta_ms: float
    max_batch: int
    slowdown: dict[int, float]
    idle_w: float
    max_w: float
    sources: dict[str, str] = field(default_factory=dict)


@functools.lru_cache(maxsize=1)
def _raw() -> dict[str, Any]:
    """The parsed data file, read once per process (every device worker asks for its kind's power at start-up);
    callers only read it."""
    text = resources.files("edgemux.profiles").joinpath("data", POWER_FILE).read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise PowerDataError(f"{POWER_FILE}: expected a mapping at the top")
    return data


def _num(entry: dict[str, Any], key: str, where: str, *, positive: bool = True) -> float:
    if key not in entry:
        raise PowerDataError(f"{where}: missing {key!r}")
    v = entry[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or (positive and v == 0):
        raise PowerDataError(f"{where}.{key}: expected a finite number {'> 0' if positive else '>= 0'}, got {v!r}")
    return float(v)


def kim_testbed(*, speed: dict[str, float] | None = None) -> tuple[str, list[AcceleratorSpec], dict[str, str]]:
    """``(model, cards, sources)`` of Kim et al.'s testbed. ``speed`` overrides the assumed relative speed of a
    card that has one in the file (e.g. ``{"rtx2080super": 0.45}``), for sensitivity runs; ``sources`` names
    the shared figures (the GPU batch-law shape, Q(2))."""
    tb = _raw().get("kim_testbed")
    if not isinstance(tb, dict):
        raise PowerDataError(f"{POWER_FILE}: no 'kim_testbed' mapping")
    law = tb["gpu_batch_law"]
    t1, t32 = _num(law, "batch1_ms", "gpu_batch_law"), _num(law, "batch32_ms", "gpu_batch_law")
    if t32 <= t1:
        raise PowerDataError(f"gpu_batch_law: batch 32 ({t32} ms) must take longer than batch 1 ({t1} ms)")
    a_shape = (t32 - t1) / 31.0
    b_shape = t1 - a_shape
    q2 = _num(tb["gpu_slowdown_2"], "value", "gpu_slowdown_2")
    shared = {"gpu_batch_law": str(law.get("source", "")),
              "gpu_slowdown_2": str(tb["gpu_slowdown_2"].get("source", ""))}
    entries = {e["name"]: e for e in tb["accelerators"]}
    cards: list[AcceleratorSpec] = []
    for e in tb["accelerators"]:
        where = f"kim_testbed.{e.get('name', '?')}"
        kind = e.get("kind")
        sources = {k: str(v) for k, v in e.items() if k.endswith("_source")}
        if kind == "fpga":
            peak = _num(e, "peak_rps", where)
            alpha = 1000.0 / peak
            beta = _num(e, "batch1_ms", where) - alpha
            if beta < 0:
                raise PowerDataError(f"{where}: batch-1 latency below 1000/peak_rps: no per-batch time left")
            slowdown = {1: 1.0}
        elif kind == "gpu":
            if "speed_vs" in e:
                ref = entries[e["speed_vs"]]
                s = (speed or {}).get(e["name"], _num(e, "speed", where))
                if not (s > 0 and math.isfinite(s)):
                    raise PowerDataError(f"{where}: speed must be > 0, got {s!r}")
                batch1 = _num(ref, "batch1_ms", f"kim_testbed.{ref['name']}") / s
            else:
                batch1 = _num(e, "batch1_ms", where)
            k = batch1 / t1
            alpha, beta = k * a_shape, k * b_shape
            slowdown = {1: 1.0, 2: q2}
        else:
            raise PowerDataError(f"{where}.kind: expected gpu or fpga, got {kind!r}")
        count = e.get("count")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise PowerDataError(f"{where}.count: expected an integer >= 1, got {count!r}")
        cards.append(AcceleratorSpec(e["name"], kind, count, alpha, beta, int(_num(e, "max_batch", where)), slowdown,
                                     _num(e, "idle_w", where, positive=False), _num(e, "max_w", where), sources))
    return str(tb.get("model", "")), cards, shared


@dataclass(frozen=True)
class EdgeNodeSpec:
    """An edge node type's power figures (W, s): host and device idle, device active, switched off, wake-up
    time; ``sources`` per field."""

    name: str
    describe: str
    host_idle_w: float
    device_idle_w: float
    device_active_w: float
    off_w: float
    wake_s: float
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def idle_w(self) -> float:
        """The node on and idle: host idle + device idle (W)."""
        return self.host_idle_w + self.device_idle_w

    @property
    def dynamic_w(self) -> float:
        """A device's extra power at full utilization: active - idle (W)."""
        return self.device_active_w - self.device_idle_w


def edge_node(name: str) -> EdgeNodeSpec:
    """The figures of edge node type ``name`` (``edge_nodes`` in power.yaml); ``PowerDataError`` naming the
    known types for an unknown one, or the field for a bad figure."""
    nodes = _raw().get("edge_nodes")
    if not isinstance(nodes, dict):
        raise PowerDataError(f"{POWER_FILE}: no 'edge_nodes' mapping")
    if name not in nodes:
        raise PowerDataError(f"unknown edge node type {name!r} (known: {', '.join(sorted(nodes))})")
    e = nodes[name]
    where = f"edge_nodes.{name}"
    spec = EdgeNodeSpec(name, str(e.get("describe", "")), _num(e, "host_idle_w", where),
                        _num(e, "device_idle_w", where, positive=False), _num(e, "device_active_w", where),
                        _num(e, "off_w", where, positive=False), _num(e, "wake_s", where, positive=False),
                        {k: str(v) for k, v in e.items() if k.endswith("_source")})
    if spec.device_active_w < spec.device_idle_w:
        raise PowerDataError(f"{where}: device_active_w ({spec.device_active_w} W) is below device_idle_w "
                             f"({spec.device_idle_w} W)")
    if spec.off_w > spec.idle_w:
        raise PowerDataError(f"{where}: off_w ({spec.off_w} W) is above the idle power ({spec.idle_w} W)")
    return spec


DEVICE_NODE_TYPE = {"edgetpu": "edgetpu-rpi4", "gpu-embedded": "jetson-nano"}
"""The edge node type whose accelerator figures a device kind's modelled power takes."""
DEVICE_CARD = {"gpu-discrete": "rtx3080", "fpga": "alveo_u200"}
"""The Kim et al. testbed card whose idle and full-load power a device kind's modelled power takes. Kinds in
neither map (the CPU) have none: the runtime then reports no power for them."""


@dataclass(frozen=True)
class DevicePower:
    """A device's modelled power: ``idle_w`` doing nothing, ``active_w`` fully busy (W), from ``source``."""

    idle_w: float
    active_w: float
    source: str

    def at(self, utilization: float) -> float:
        """Power (W) at ``utilization`` in [0, 1] (linear between idle and active)."""
        u = min(max(float(utilization), 0.0), 1.0)
        return self.idle_w + (self.active_w - self.idle_w) * u


FALLBACK_NODE_TYPE = "edgetpu-rpi4"
"""The edge node type whose wake-up time a node takes when none of its device kinds names one."""


def node_wake_s(kinds: Iterable[str]) -> tuple[float, str]:
    """A node's wake-up time (s, from switched on to serving) and where it comes from: the longest among the
    edge node types of its device kinds (``DEVICE_NODE_TYPE``); a node with none of those kinds takes
    ``FALLBACK_NODE_TYPE``'s, and the source says so."""
    types = sorted({DEVICE_NODE_TYPE[k] for k in kinds if k in DEVICE_NODE_TYPE})
    if not types:
        spec = edge_node(FALLBACK_NODE_TYPE)
        return spec.wake_s, (f"power.yaml edge_nodes.{FALLBACK_NODE_TYPE}.wake_s, taken for a node with no figure "
                             f"of its own ({spec.sources.get('wake_source', '')})")
    spec = max((edge_node(t) for t in types), key=lambda e: (e.wake_s, e.name))
    return spec.wake_s, f"power.yaml edge_nodes.{spec.name}.wake_s ({spec.sources.get('wake_source', '')})"


def device_power(kind: str) -> DevicePower | None:
    """The modelled power of a device of ``kind`` (a ``DeviceKind`` value), or None where no figure exists."""
    node = DEVICE_NODE_TYPE.get(kind)
    if node is not None:
        spec = edge_node(node)
        return DevicePower(spec.device_idle_w, spec.device_active_w,
                           f"power.yaml edge_nodes.{node} ({spec.sources.get('device_active_source', '')})")
    card = DEVICE_CARD.get(kind)
    if card is not None:
        c = next(x for x in kim_testbed()[1] if x.name == card)
        return DevicePower(c.idle_w, c.max_w, f"power.yaml kim_testbed.{card} ({c.sources.get('max_w_source', '')})")
    return None
