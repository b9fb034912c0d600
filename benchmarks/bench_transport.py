"""What delivering a request costs, by transport: binary HTTP beside system shared memory, over tensor sizes.

Starts an agent (node ``edge-1`` of ``examples/local/cluster.yaml``: emulated Edge TPU ``tpu0`` and Jetson-class
GPU ``gpu0``) and a gateway in front of it, each its own process, as ``edgemux up`` does. Serves one app per
input size (MobileNetV2 on the Edge TPU at S x S pixels: a uint8 S x S x 3 frame in, 1000 scores out) and a
detector (SSDLite-MobileNetV2 at 416 x 416 on the GPU: 2.1 MB of FP32 in, 1.3 MB of boxes and scores out, the
demo's ``detect-people``). Each app is loaded through the gateway with ``edgemux load``'s generator
(``runtime.tools.load.run_load``: open loop, Poisson) once as binary HTTP and once in shared memory, in
alternating repetitions, and the cost of delivery is read per request as the end-to-end latency minus what
the agent measured on the device for it (queueing + service): the client's encoding and sending, the
gateway, the agent's decoding and encoding, and the answer's way back.

    .venv/bin/python benchmarks/bench_transport.py [--sizes 32,64,128,224,320,448] [--seconds 3] [--reps 2]
        [--rate 10] [--quick]

Prints one row per app (input bytes, each transport's mean cost and its 95 % CI over requests, shm minus
binary) and the smallest input from which shared memory costs less than binary HTTP (``SHM_MIN_BYTES`` in
``runtime.dataplane.shm`` is the threshold of edgemux's load generator and Python client). Units: ms, bytes. Emulated devices: the device
time is the profile's; the delivery cost is real.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

# how bench_peers.py (beside this script) starts, waits for, configures and stops its servers
from bench_peers import PeerError, Running, _free_port, _put_json, _spawn, _wait_live  # noqa: E402

from edgemux.runtime.dataplane.shm import SHM_MIN_BYTES  # noqa: E402
from edgemux.runtime.tools.load import run_load  # noqa: E402
from edgemux.sim.stats import confidence_interval  # noqa: E402

DETECTOR = ("det", {"device": "gpu0", "model": "zoo:ssdlite_mobilenet_v2@416x416",
                    "profile": "ibis-jetson-nano/yolov4_tiny"})


def _costs(report) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Per ok request: its end-to-end latency minus its own queue + service at the agent (ms)."""
    return np.asarray(report.latencies_ms - report.device_ms, dtype=float)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="32,64,128,224,320,448", help="Edge TPU input sizes in pixels (S x S x 3)")
    ap.add_argument("--seconds", type=float, default=3.0, help="seconds of load per run (default 3)")
    ap.add_argument("--reps", type=int, default=2, help="runs per transport and app, alternating (default 2)")
    ap.add_argument("--rate", type=float, default=10.0, help="offered req/s per run (default 10)")
    ap.add_argument("--quick", action="store_true", help="sizes 32,224, 1 s, 1 repetition (smoke test)")
    args = ap.parse_args(argv)
    if args.quick:
        args.sizes, args.seconds, args.reps = "32,224", 1.0, 1
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        print(f"bench_transport: --sizes must be comma-separated integers, got {args.sizes!r}", file=sys.stderr)
        return 2
    if not all(s >= 32 for s in sizes) or args.seconds <= 0 or args.reps < 1 or args.rate <= 0:
        print("bench_transport: sizes >= 32, --seconds > 0, --reps >= 1 and --rate > 0", file=sys.stderr)
        return 2
    if not Path("/dev/shm").is_dir():
        print("bench_transport: no /dev/shm on this host: nothing to compare", file=sys.stderr)
        return 2

    agent_port, gw_port = _free_port(), _free_port()
    logs = Path(tempfile.mkdtemp(prefix="bench-transport-"))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    procs = [_spawn([sys.executable, "-m", "edgemux", "agent", "--cluster", str(ROOT / "examples/local/cluster.yaml"),
                     "--node", "edge-1", "--port", str(agent_port), "--log-level", "warning"], logs / "agent.log",
                    env=env),
             _spawn([sys.executable, "-m", "edgemux", "gateway", "--port", str(gw_port), "--log-level", "warning",
                     "--timeout-s", "30"], logs / "gateway.log", env=env)]
    servers = Running("edgemux", procs, [], 0.0, [logs / "agent.log", logs / "gateway.log"])
    agent, gateway = f"http://127.0.0.1:{agent_port}", f"http://127.0.0.1:{gw_port}"
    try:
        for url, proc, log in zip((agent, gateway), procs, servers.logs):
            _wait_live(url, proc, log)
        apps = [(f"tpu{s}", {"device": "tpu0", "model": f"zoo:mobilenet_v2@{s}",
                             "profile": "ibis-edgetpu/mobilenet_v2"}) for s in sizes] + [DETECTOR]
        for app, spec in apps:
            _put_json(f"{agent}/v1/apps/{app}", spec)
            _put_json(f"{gateway}/v1/routes/{app}", {"model": app, "endpoints": [{"url": agent, "weight": 1}],
                                                "rate_rps": 1e9, "burst": 1e9})
        print(f"delivery cost = end-to-end minus the agent's queue + service, mean over requests (ms), through "
              f"the gateway; {args.reps} x {args.seconds:g} s per transport at {args.rate:g} req/s, alternating")
        print(f"{'app':8}  {'input bytes':>11}  {'binary HTTP':>18}  {'shared memory':>18}  {'shm - binary':>12}")
        crossing = None
        for app, _spec in apps:
            got: dict[str, list[np.ndarray]] = {"binary": [], "shm": []}
            size = 0
            for _ in range(args.reps):
                for transport in ("binary", "shm"):
                    rep = asyncio.run(run_load(gateway, app, rate_rps=args.rate, duration_s=args.seconds,
                                               seed=len(got[transport]), shm=transport == "shm"))
                    if rep.ok != rep.sent or rep.transport != transport:
                        raise SystemExit(f"bench_transport: {app} over {transport}: {rep.ok}/{rep.sent} ok, "
                                         f"transport {rep.transport}, errors {rep.errors}")
                    got[transport].append(_costs(rep))
            meta = json.loads(urllib.request.urlopen(f"{agent}/v2/models/{app}").read())
            (inp,) = meta["inputs"]
            size = int(np.prod([1 if d < 0 else d for d in inp["shape"]])) * (4 if inp["datatype"] == "FP32" else 1)
            cells, means = [], {}
            for transport in ("binary", "shm"):
                x = np.concatenate(got[transport])
                means[transport] = float(x.mean())
                ci = confidence_interval(x)
                cells.append(f"{x.mean():6.2f} [{ci.lo:5.2f},{ci.hi:5.2f}]")
            diff = means["shm"] - means["binary"]
            print(f"{app:8}  {size:>11}  {cells[0]:>18}  {cells[1]:>18}  {diff:>+12.2f}")
            if app != "det" and diff < 0 and crossing is None:
                crossing = size
        print(f"shared memory costs less from {crossing} bytes of input on" if crossing is not None else
              "shared memory never cost less on this host at these sizes",
              f"(the load generator's SHM_MIN_BYTES: {SHM_MIN_BYTES})")
        return 0
    except PeerError as e:
        print(f"bench_transport: edgemux did not start: {e}", file=sys.stderr)
        return 1
    finally:
        servers.stop()


if __name__ == "__main__":
    sys.exit(main())
