"""A closed-loop load generator for the serving benchmarks, run as its own process so that it does not share
the server's GIL (on a small host it still shares the cores: its figures are lower bounds for the server).

``k`` asyncio tasks on one aiohttp session each POST the same pre-encoded body back to back, the next request
when the previous one answered; completions are counted in a window of ``seconds`` after ``warm`` seconds.

    .venv/bin/python benchmarks/closedloop.py URL --body-file FILE [--headers JSON] [--concurrency K]
                                               [--seconds S] [--warm S]

or, from another benchmark, ``closedloop.run_level(...)``, which runs it so.

Prints one JSON line: ``k``, ``completed``, ``rps`` (req/s), ``errors`` (non-200 answers and transport
failures, counted anywhere in the run), ``p50_ms`` and ``p99_ms`` of the completions in the window.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import numpy as np


async def closed_loop(url: str, body: bytes, headers: dict[str, str], k: int, warm_s: float,
                      seconds: float) -> dict[str, Any]:
    """``k`` tasks each POSTing ``body`` to ``url`` back to back; see the module docstring (s, ms, req/s)."""
    import aiohttp

    done = 0
    errors = 0
    lat: list[float] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        t0 = time.perf_counter()
        start, stop = t0 + warm_s, t0 + warm_s + seconds

        async def one() -> None:
            nonlocal errors, done
            while True:
                s = time.perf_counter()
                if s >= stop:
                    return
                try:
                    async with session.post(url, data=body, headers=headers) as resp:
                        await resp.read()
                        ok = resp.status == 200
                except aiohttp.ClientError:
                    ok = False  # counted, not fatal: the figure must say if the server dropped anything
                e = time.perf_counter()
                if not ok:
                    errors += 1
                elif start <= e < stop:
                    done += 1
                    lat.append((e - s) * 1000.0)

        await asyncio.gather(*(one() for _ in range(k)))
    return {"k": k, "completed": done, "rps": done / seconds, "errors": errors,
            "p50_ms": float(np.percentile(lat, 50)) if lat else float("nan"),
            "p99_ms": float(np.percentile(lat, 99)) if lat else float("nan")}


def run_level(url: str, body_file: str, headers: dict[str, str], k: int, seconds: float,
              warm_s: float) -> dict[str, Any]:
    """One closed-loop level as its own process (this script): its JSON line as a dict (see the module
    docstring; s, ms, req/s). RuntimeError with the tail of its stderr when it fails."""
    import subprocess
    import sys

    cmd = [sys.executable, __file__, url, "--body-file", body_file, "--headers", json.dumps(headers),
           "--concurrency", str(k), "--seconds", str(seconds), "--warm", str(warm_s)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120 + 2 * (seconds + warm_s), check=False)
    if done.returncode != 0:
        raise RuntimeError(f"load generator failed (k={k}): {done.stderr.strip()[-2000:]}")
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("--body-file", required=True, help="the request body, sent as is")
    ap.add_argument("--headers", default="{}", help="HTTP headers as a JSON object")
    ap.add_argument("--concurrency", type=int, default=1, help="clients in the closed loop (default 1)")
    ap.add_argument("--seconds", type=float, default=3.0, help="length of the counted window (default 3 s)")
    ap.add_argument("--warm", type=float, default=0.5, help="uncounted start of the run (default 0.5 s)")
    args = ap.parse_args(argv)
    with open(args.body_file, "rb") as f:
        body = f.read()
    from edgemux.runtime.process import run as run_loop  # the serving processes' loop (uvloop when installed)

    out = run_loop(closed_loop(args.url, body, json.loads(args.headers), args.concurrency, args.warm, args.seconds))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
