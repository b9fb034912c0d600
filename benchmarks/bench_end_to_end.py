"""Predicted vs observed end to end on the local cluster, as `edgemux load` sees it, and where the rest goes.

Brings up the local cluster (``engines.local.Engine`` on ``examples/local/cluster.yaml``, adaptation on with
its default 5 s windows), applies ``examples/local/apps.yaml``, then runs ``--rounds`` rounds over the
admitted apps in turn: per app, the control plane's ``describe`` (the prediction ``edgemux load`` reads: the
device's queueing + service plus the node's serving path, ``adapt.serving``) and then ``--duration`` seconds
of open-loop load at the app's contract through the gateway (``runtime.tools.load.run_load``, the generator
behind ``edgemux load``). Prints, per round and app, the observed and predicted mean (ms), the error
(predicted - observed) / observed, the serving path in the prediction and the agents' own queueing +
service (what the device took).

Then the client's side, which no report carries: a client sends ``--probe-app``'s tensors at a fixed gap,
once through the gateway and once to its agent directly, and takes each answer's latency less the agent's
own queueing + service (its ``edgemux_queue_ms``/``edgemux_service_ms``): the whole overhead between client
and device, at a 50 ms and at a 5 ms gap between requests (the 5 ms run through the gateway exceeds the
app's contract for its last requests: their policing wait is left out by stopping after ``--probe-requests``
within the bucket).

Usage: ``python benchmarks/bench_end_to_end.py [--rounds 3] [--duration 8] [--probe-app classify]``.
Units: ms, req/s, s.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "local"


def _device_ms(params: dict[str, Any]) -> float | None:
    try:
        return float(params["edgemux_queue_ms"]) + float(params["edgemux_service_ms"])
    except (KeyError, TypeError, ValueError):
        return None


async def probe(base: str, app: str, token: str | None, gap_s: float, requests: int) -> tuple[float, float]:
    """(mean, median) of answer latency less the agent's queueing + service (ms), ``requests`` answers sent
    ``gap_s`` apart (the first 5 dropped: connections warm up)."""
    import aiohttp

    from edgemux.runtime.dataplane.protocol import decode_infer_response, encode_infer_request
    from edgemux.runtime.tools.load import default_inputs, fetch_model_metadata

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession(headers=headers) as s:
        meta = await fetch_model_metadata(s, base, app, 30.0)
        body, head = encode_infer_request(default_inputs(list(meta.inputs), 0), binary=True)
        url = f"{base}/v2/models/{app}/infer"
        gaps = []
        for _ in range(requests):
            t = time.perf_counter()
            async with s.post(url, data=body, headers=head) as r:
                raw = await r.read()
                hlen = r.headers.get("Inference-Header-Content-Length")
            took = (time.perf_counter() - t) * 1000.0
            dev = _device_ms(decode_infer_response(raw, hlen).parameters)
            if dev is not None:
                gaps.append(took - dev)
            await asyncio.sleep(gap_s)
    kept = gaps[5:]
    return statistics.fmean(kept), statistics.median(kept)


def main(argv: list[str] | None = None) -> int:
    from edgemux.cli.load_cmd import predicted_summary
    from edgemux.cli.table import render
    from edgemux.engines.local import Engine
    from edgemux.runtime.process import run as run_loop
    from edgemux.runtime.tools.load import run_load

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=8.0, help="seconds of load per app and round")
    p.add_argument("--probe-app", default="classify")
    p.add_argument("--probe-requests", type=int, default=40)
    args = p.parse_args(argv)

    with Engine(EXAMPLES / "cluster.yaml", heartbeat_s=1.0) as eng:
        assert eng.controlplane_url is not None and eng.gateway_url is not None
        cp = eng.client(timeout_s=60.0)
        answer = cp.apply((EXAMPLES / "apps.yaml").read_bytes())
        apps = [r.app for r in answer.results if r.rejection is None]
        pending = cp.wait_ready(apps, 60.0)
        apps = [a for a in apps if a not in pending]
        rows = []
        for rnd in range(1, args.rounds + 1):
            for app in apps:
                d = cp.describe(app)
                spec = d["spec"]["spec"]
                periodic = "fps" in spec
                rate = float(spec["fps"] if periodic else spec["rate"])
                pred = predicted_summary(d, "mean", None)["mean_ms"]
                piece = d["placement"]["pieces"][0]["predicted"]
                rep = run_loop(run_load(eng.gateway_url, app, rate_rps=rate, duration_s=args.duration,
                                        arrivals="periodic" if periodic else "poisson", seed=rnd, key=eng.token))
                device = (None if rep.server_queue_ms is None or rep.server_service_ms is None
                          else rep.server_queue_ms + rep.server_service_ms)
                err = (pred - rep.mean_ms) / rep.mean_ms * 100.0 if isinstance(pred, float) else None
                rows.append([str(rnd), app, f"{rep.mean_ms:.2f}", f"{pred:.2f}" if isinstance(pred, float) else "-",
                             f"{err:+.1f} %" if err is not None else "-", f"{piece.get('serving_ms') or 0:.2f}",
                             f"{device:.2f}" if device is not None else "-"])
                print("  ".join(rows[-1]), flush=True)
        print()
        print(render(["round", "app", "observed mean", "predicted mean", "error", "serving path",
                      "agent queue + service"], rows))
        probe_node = cp.describe(args.probe_app)["placement"]["pieces"][0]["node"]
        agent = eng.agent_urls.get(probe_node)
        print(f"\nclient-to-device overhead of {args.probe_app} (answer latency less the agent's queueing + "
              f"service, ms; mean / median of {args.probe_requests - 5} answers):")
        for gap in (0.05, 0.005):
            time.sleep(2.5)  # the app's buckets (gateway's and agent's) refill: no probe waits for a token
            via = run_loop(probe(eng.gateway_url, args.probe_app, eng.token, gap, args.probe_requests))
            time.sleep(2.5)
            direct = (run_loop(probe(agent, args.probe_app, eng.token, gap, args.probe_requests))
                      if agent else (float("nan"), float("nan")))
            print(f"  {gap * 1000:.0f} ms apart: through the gateway {via[0]:.2f} / {via[1]:.2f}; "
                  f"to the agent directly {direct[0]:.2f} / {direct[1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
