"""The open-loop load generator (runtime/tools/load.py) and ``edgemux load`` (cli/load_cmd.py) against tiny
Open Inference Protocol servers and a fake control plane on 127.0.0.1.

No wall-clock thresholds are asserted: only counts (Poisson interval, exact periodic counts, errors by kind
matching what the server answered) and relations (p50 <= p95 <= p99, latency >= the server's own delay,
attainment 1 or 0 when the SLO is far above or below that delay). Each run is a fraction of a second to 1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import numpy as np
import pytest
from scipy import stats

from edgemux.cli import load_cmd
from edgemux.errors import InputError
from edgemux.runtime.tools.load import LoadError, default_inputs, run_load, schedule_ms
from edgemux.runtime.httpserver import Application, Request, Response, get, post
from edgemux.runtime.httputil import json_response
from edgemux.runtime.dataplane.protocol import (
    HEADER_LENGTH_HEADER,
    TensorSpec,
    decode_infer_request,
    encode_infer_response,
    error_body,
    model_metadata_body,
)
from support import LoopThread, serve_app, strict_json

DELAY_S = 0.005  # the fixed server delay (s)
QUEUE_MS, SERVICE_MS = 1.5, 3.0  # what the fake agent reports in its response parameters
GUARD_S = 20.0  # wait_for around a run: a guard against hanging, not a timing assertion
INPUTS = (TensorSpec("x", "FP32", (-1, 3, 4, 4)), TensorSpec("mask", "UINT8", (-1, 2)))


# ------------------------------------------------------------------------------------------ infrastructure


class Oip:
    """A small Open Inference Protocol server. ``delay_s`` (+ uniform ``jitter_s``) per answer, measured on
    the server with perf_counter so the test may rely on latency >= delay; ``fail(i)`` gives the HTTP status
    of the i-th request (200: answer); ``hang`` never answers (until ``release`` is set at teardown);
    ``devices`` are reported round robin as ``edgemux_device``, emulated unless in ``real``."""

    def __init__(self, *, delay_s: float = DELAY_S, jitter_s: float = 0.0, fail: Callable[[int], int] | None = None,
                 hang: bool = False, devices: tuple[str, ...] = ("node-1/cpu0",), meta_status: int = 200,
                 real: frozenset[str] = frozenset(), meta_body: bytes | None = None) -> None:
        self.delay_s, self.jitter_s, self.fail, self.hang = delay_s, jitter_s, fail, hang
        self.devices, self.meta_status, self.real = devices, meta_status, real
        self.meta_body = meta_body  # a metadata body to send instead of the well-formed one
        self.rng = np.random.default_rng(5)
        self.n = 0
        self.statuses: list[int] = []
        self.inputs: list[dict[str, tuple[tuple[int, ...], np.dtype]]] = []
        self.release = asyncio.Event()

    def app(self) -> Application:
        return Application([post("/v2/models/{m}/infer", self.infer), get("/v2/models/{m}", self.metadata)])

    async def infer(self, request: Request) -> Response:
        start = time.perf_counter()
        body = await request.read()
        i, self.n = self.n, self.n + 1
        if self.hang:
            await self.release.wait()
            return Response(status=503)
        code = self.fail(i) if self.fail else 200
        if code != 200:
            self.statuses.append(code)
            return Response(status=code, body=error_body("busy"), content_type="application/json")
        req = decode_infer_request(body, request.headers.get(HEADER_LENGTH_HEADER))
        self.inputs.append({t.name: (tuple(t.data.shape), t.data.dtype) for t in req.inputs})
        delay = self.delay_s + float(self.rng.uniform(0.0, self.jitter_s))
        while (left := delay - (time.perf_counter() - start)) > 0:  # sleep may wake a hair early: loop
            await asyncio.sleep(left)
        device = self.devices[i % len(self.devices)]
        params = {"edgemux_queue_ms": QUEUE_MS, "edgemux_service_ms": SERVICE_MS,
                  "edgemux_device": device, "edgemux_emulated": device not in self.real}
        data, headers = encode_infer_response(request.match_info["m"], "1", {"y": np.zeros((1, 2), np.float32)},
                                              req, parameters=params)
        self.statuses.append(200)
        return Response(status=200, body=data, headers=headers)

    async def metadata(self, request: Request) -> Response:
        if self.meta_status != 200:
            return Response(status=self.meta_status, body=error_body("unknown model"),
                                content_type="application/json")
        body = self.meta_body if self.meta_body is not None else model_metadata_body(
            request.match_info["m"], ["1"], "emulated", list(INPUTS), [TensorSpec("y", "FP32", (-1, 2))])
        return Response(body=body, content_type="application/json")


def _refused_url() -> str:
    """A URL on which nothing listens (a port just bound and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def with_server(oip: Oip, body: Callable[[str], Coroutine[Any, Any, Any]]) -> Any:
    """Run ``body(url)`` against ``oip`` in a fresh event loop; the server is torn down whatever happens."""

    async def main() -> Any:
        runner, url = await serve_app(oip.app(), 0.5)
        try:
            return await asyncio.wait_for(body(url), GUARD_S)
        finally:
            oip.release.set()
            await runner.stop()

    return asyncio.run(main())


# --------------------------------------------------------------------------------------------- run_load


def test_poisson_run_all_ok_with_ordered_percentiles_and_server_parameters() -> None:
    oip = Oip()
    rep = with_server(oip, lambda url: run_load(url, "cam", rate_rps=50, duration_s=1.0, seed=3, slo_ms=10_000))
    lo, hi = stats.poisson.ppf(0.0005, 50), stats.poisson.ppf(0.9995, 50)
    assert lo <= rep.scheduled <= hi
    assert rep.sent == rep.scheduled == rep.ok == len(oip.statuses) == len(rep.latencies_ms)
    assert rep.errors == {} and rep.failed == 0
    assert rep.p50_ms <= rep.p95_ms <= rep.p99_ms <= rep.max_ms
    assert rep.min_ms >= DELAY_S * 1000.0  # the client's interval contains the server's delay
    assert rep.min_ms <= rep.mean_ms <= rep.max_ms
    assert rep.mean_ci_ms is not None and rep.mean_ci_ms[0] <= rep.mean_ms <= rep.mean_ci_ms[1]
    assert 0 < rep.throughput_rps <= rep.ok / rep.duration_s
    assert rep.elapsed_s >= rep.duration_s
    assert rep.send_lateness_mean_ms >= 0 and rep.send_lateness_max_ms >= rep.send_lateness_mean_ms
    assert rep.server_queue_ms == pytest.approx(QUEUE_MS) and rep.server_service_ms == pytest.approx(SERVICE_MS)
    assert rep.server_reported == rep.ok
    assert set(rep.by_device) == {"node-1/cpu0"} and rep.by_device["node-1/cpu0"].ok == rep.ok
    assert rep.by_device["node-1/cpu0"].emulated is True
    assert rep.slo_attainment == 1.0 and rep.slo_met is True and rep.slo_observed_ms == rep.mean_ms
    assert rep.seed == 3 and rep.offered_rps == 50
    d = rep.to_dict()
    json.dumps(d)  # JSON-ready
    assert d["sent"] == rep.sent and d["server"]["queue_ms"] == pytest.approx(QUEUE_MS)
    assert "latencies_ms" not in d and len(rep.to_dict(samples=True)["latencies_ms"]) == rep.ok


def test_periodic_count_is_exact_and_random_delays_keep_the_order() -> None:
    oip = Oip(delay_s=0.001, jitter_s=0.004)
    rep = with_server(oip, lambda url: run_load(url, "cam", rate_rps=50, duration_s=1.0, arrivals="periodic",
                                                seed=11, binary=False))
    assert rep.scheduled == rep.sent == rep.ok == 50
    assert rep.p50_ms <= rep.p95_ms <= rep.p99_ms
    assert rep.min_ms >= 1.0
    gaps = np.diff(rep.offsets_ms)
    assert np.allclose(gaps, 20.0)  # 1000 / 50 ms apart, one random phase


def test_errors_are_counted_by_http_status() -> None:
    codes = {1: 503, 2: 429}
    oip = Oip(delay_s=0.0, fail=lambda i: codes.get(i % 4, 200))
    rep = with_server(oip, lambda url: run_load(url, "cam", rate_rps=60, duration_s=0.5, seed=2))
    assert rep.sent == rep.scheduled == oip.n
    assert rep.errors.get("503", 0) == oip.statuses.count(503) > 0
    assert rep.errors.get("429", 0) == oip.statuses.count(429) > 0
    assert rep.ok == oip.statuses.count(200)
    assert rep.ok + rep.failed == rep.scheduled
    assert len(rep.latencies_ms) == rep.ok  # latencies are of ok requests only


def test_a_server_that_never_answers_times_out_and_the_run_ends() -> None:
    oip = Oip(hang=True)
    inputs = {"x": np.ones((1, 3), np.float32)}  # no metadata needed
    rep = with_server(oip, lambda url: run_load(url, "cam", rate_rps=20, duration_s=0.5, timeout_s=0.2,
                                                inputs=inputs, seed=1, slo_ms=100))
    assert rep.scheduled > 0 and rep.errors == {"timeout": rep.sent} and rep.ok == 0
    assert np.isnan(rep.p50_ms) and rep.mean_ci_ms is None and rep.throughput_rps == 0
    assert rep.slo_attainment == 0.0 and rep.slo_met is False
    assert rep.to_dict()["p50_ms"] is None


def test_connection_refused_is_counted() -> None:
    url = _refused_url()
    rep = asyncio.run(asyncio.wait_for(run_load(url, "cam", rate_rps=40, duration_s=0.25, timeout_s=1.0,
                                                inputs={"x": np.ones(2, np.float32)}), GUARD_S))
    assert rep.scheduled > 0 and rep.errors == {"connection": rep.sent} and rep.ok == 0


def test_concurrency_limit_counts_unsent_requests() -> None:
    oip = Oip(hang=True)
    rep = with_server(oip, lambda url: run_load(url, "cam", rate_rps=50, duration_s=0.5, arrivals="periodic",
                                                timeout_s=0.3, concurrency_limit=2,
                                                inputs={"x": np.ones(2, np.float32)}))
    assert rep.scheduled == 25
    assert rep.errors["client_limit"] > 0
    assert rep.errors["client_limit"] + rep.errors["timeout"] == rep.scheduled
    assert rep.sent == rep.errors["timeout"] == oip.n


def test_seeded_runs_send_at_identical_offsets() -> None:
    oip = Oip(delay_s=0.0)

    async def three(url: str) -> list[Any]:
        return [await run_load(url, "cam", rate_rps=40, duration_s=0.4, seed=s) for s in (7, 7, 8)]

    a, b, c = with_server(oip, three)
    assert np.array_equal(a.offsets_ms, b.offsets_ms) and a.sent == b.sent
    assert np.array_equal(a.offsets_ms, schedule_ms(40, 0.4, "poisson", 7))
    assert not np.array_equal(a.offsets_ms, c.offsets_ms)
    assert oip.n == a.sent + b.sent + c.sent


def test_default_inputs_follow_the_model_metadata() -> None:
    oip = Oip(delay_s=0.0)
    rep = with_server(oip, lambda url: run_load(url, "cam", rate_rps=30, duration_s=0.3, seed=4))
    assert rep.ok == rep.sent == len(oip.inputs) > 0
    for seen in oip.inputs:
        assert seen == {"x": ((1, 3, 4, 4), np.dtype(np.float32)), "mask": ((1, 2), np.dtype(np.uint8))}


def test_default_inputs_are_seeded_and_typed() -> None:
    specs = [*INPUTS, TensorSpec("flag", "BOOL", (2,)), TensorSpec("text", "BYTES", (-1, 3)),
             TensorSpec("ids", "INT64", (-1, -1))]
    a, b, c = default_inputs(specs, 1), default_inputs(specs, 1), default_inputs(specs, 2)
    assert a["x"].shape == (1, 3, 4, 4) and a["x"].dtype == np.float32
    assert a["mask"].dtype == np.uint8 and a["flag"].dtype == np.bool_ and a["flag"].shape == (2,)
    assert a["text"].shape == (1, 3) and all(isinstance(v, bytes) for v in a["text"].ravel())
    assert a["ids"].shape == (1, 1) and a["ids"].dtype == np.int64
    assert all(np.array_equal(a[k], b[k]) for k in a) and not np.array_equal(a["x"], c["x"])


def test_metadata_failure_is_a_load_error() -> None:
    oip = Oip(meta_status=404)
    with pytest.raises(LoadError, match="HTTP 404: unknown model"):
        with_server(oip, lambda url: run_load(url, "nope", rate_rps=10, duration_s=0.1))
    assert oip.n == 0  # nothing was sent


@pytest.mark.parametrize("body, needle", [
    (b"{nope", "cannot use the model metadata from .*: malformed model metadata JSON"),
    (b'{"name": "cam", "inputs": [{"name": "x", "datatype": "FP32", "shape": "3"}]}',
     r"inputs\[0\]: 'shape' must be a list of integers >= -1"),
    (b'{"name": "cam", "inputs": []}', "lists no inputs"),
])
def test_unusable_metadata_is_a_load_error_naming_the_field(body: bytes, needle: str) -> None:
    oip = Oip(meta_body=body)
    with pytest.raises(LoadError, match=needle):
        with_server(oip, lambda url: run_load(url, "cam", rate_rps=10, duration_s=0.1))
    assert oip.n == 0


def test_slo_attainment_and_percentile_slo() -> None:
    oip = Oip()

    async def both(url: str) -> list[Any]:
        far = await run_load(url, "cam", rate_rps=40, duration_s=0.3, seed=1, slo_ms=5_000, slo_stat="p95")
        tight = await run_load(url, "cam", rate_rps=40, duration_s=0.3, seed=1, slo_ms=DELAY_S * 1000 / 2,
                               slo_stat="p99")
        return [far, tight]

    far, tight = with_server(oip, both)
    assert far.slo_observed_ms == far.p95_ms and far.slo_met is True and far.slo_attainment == 1.0
    assert tight.slo_observed_ms == tight.p99_ms and tight.slo_met is False and tight.slo_attainment == 0.0
    assert tight.slo_attainment_sent == 0.0


@pytest.mark.parametrize("kwargs,field", [
    ({"rate_rps": -1.0}, "rate"), ({"rate_rps": 0}, "rate"), ({"duration_s": 0.0}, "duration"),
    ({"arrivals": "bursty"}, "arrivals"), ({"timeout_s": 0}, "timeout_s"), ({"slo_stat": "p90"}, "slo_stat"),
    ({"slo_ms": -5.0}, "slo_ms"), ({"concurrency_limit": 0}, "concurrency_limit"), ({"seed": -1}, "seed"),
])
def test_run_load_refuses_bad_arguments(kwargs: dict[str, Any], field: str) -> None:
    args: dict[str, Any] = {"rate_rps": 10.0, "duration_s": 1.0, **kwargs}
    with pytest.raises(InputError) as e:
        asyncio.run(run_load("http://127.0.0.1:9", "cam", inputs={"x": np.ones(1, np.float32)}, **args))
    assert e.value.field == field


# --------------------------------------------------------------------------------------------------- CLI


def _piece(device: str, kind: str, weight: float, emulated: bool | None,
           mean: float, p95: float, p99: float) -> dict[str, Any]:
    """One piece of ``GET /v1/apps/{name}`` as ControlPlane.describe writes it."""
    return {"device": device, "node": device.split("/")[0], "kind": kind, "discipline": "fcfs", "weight": weight,
            "profile": "p", "model_source": "zoo:mobilenet_v2@224", "stand_in": None, "emulated": emulated,
            "emulated_known_from": "agent",
            "predicted": {"mean_ms": mean, "p95_ms": p95, "p99_ms": p99, "device_ms": 5.0, "utilization": 0.4,
                          "method": "mg1", "at_slo_stat_ms": p95},
            "agent": "http://agent", "status": "loaded", "error": None}


class FakeControlPlane:
    """Answers ``/v1/apps/{name}``, ``/v1/routes/{app}`` and ``/v1/gateways`` in the control plane's shape for
    one app ``cam`` (40 fps, SLO p95 <= 500 ms, pieces 0.75 on an emulated Edge TPU and 0.25 on a CPU whose
    backend the control plane does not know yet: the agent's answers say it is real)."""

    def __init__(self, gateway: str) -> None:
        self.gateway = gateway
        self.pieces = [_piece("node-1/tpu0", "edgetpu", 0.75, True, 10.0, 20.0, 30.0),
                       _piece("node-2/cpu0", "cpu", 0.25, None, 20.0, 40.0, 60.0)]

    def app(self) -> Application:
        return Application([get("/v1/apps/{name}", self.describe), get("/v1/routes/{app}", self.route),
                            get("/v1/gateways", self.gateways)])

    def _route(self) -> dict[str, Any]:
        return {"app": "cam", "model": "cam", "rate_rps": 40.0, "burst": 4.0, "pending": [],
                "endpoints": [{"url": "http://agent", "weight": p["weight"], "node": p["node"], "device": p["device"]}
                              for p in self.pieces]}

    async def describe(self, request: Request) -> Response:
        name = request.match_info["name"]
        if name != "cam":
            return json_response({"error": f"unknown app '{name}' (apps: cam)"}, status=404)
        spec = {"apiVersion": "edgemux/v1", "kind": "App", "metadata": {"name": "cam"},
                "spec": {"model": "mobilenet_v2", "fps": 40.0, "burst": 4.0,
                         "slo": {"latencyMs": 500.0, "stat": "p95"}}}
        return json_response({"name": "cam", "spec": spec, "status": "ready",
                                  "slo": {"latency_ms": 500.0, "stat": "p95"},
                                  "placement": {"cpu_node": "node-1", "pieces": self.pieces},
                                  "reason": "policy edgemux: partitioned", "route": self._route()})

    async def route(self, request: Request) -> Response:
        if request.match_info["app"] != "cam":
            return json_response({"error": "unknown app"}, status=404)
        return json_response(self._route())

    async def gateways(self, request: Request) -> Response:
        return json_response({"gateways": [{"url": self.gateway, "last_error": None}]})


@pytest.fixture
def servers() -> Iterator[tuple[str, str, Oip]]:
    """(control plane URL, gateway URL, the gateway's Oip) served from a background loop."""
    lt = LoopThread()
    oip = Oip(delay_s=0.001, devices=("node-1/tpu0", "node-1/tpu0", "node-1/tpu0", "node-2/cpu0"),
              real=frozenset({"node-2/cpu0"}))

    async def up() -> tuple[list[Any], str, str]:
        gw_runner, gw = await serve_app(oip.app(), 0.5)
        cp_runner, cp = await serve_app(FakeControlPlane(gw).app(), 0.5)
        return [gw_runner, cp_runner], cp, gw

    runners, cp, gw = lt.run(up())
    try:
        yield cp, gw, oip
    finally:
        async def down() -> None:
            oip.release.set()
            for r in runners:
                await r.stop()

        lt.run(down())
        lt.stop()


def _root(argv: list[str]) -> argparse.Namespace:
    """Parse ``edgemux load ARGV`` with a bare parser: main.py registers add_parser the same way."""
    parser = argparse.ArgumentParser(prog="edgemux")
    load_cmd.add_parser(parser.add_subparsers())
    return parser.parse_args(["load", *argv])


def test_cli_predicted_beside_observed(servers: tuple[str, str, Oip], capsys: pytest.CaptureFixture[str]) -> None:
    cp, gw, oip = servers
    args = _root(["--app", "cam", "--duration", "0.5", "--server", cp, "--seed", "3"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith(f"edgemux load: app cam via {gw}, periodic 40 fps for 0.5 s, seed 3")
    assert lines[1].startswith("requests: scheduled 20, sent 20, ok 20, failed 0")
    assert "node-1/tpu0 (edgetpu, emulated, weight 0.75)" in out and "node-2/cpu0 (cpu, real, weight 0.25)" in out
    rows = {line.split("  ")[0]: line for line in lines}
    # weighted by piece weights: mean 0.75*10 + 0.25*20, p95 0.75*20 + 0.25*40, p99 0.75*30 + 0.25*60
    assert rows["mean ms"].rstrip().endswith("12.5")
    assert rows["p95 ms"].rstrip().endswith("25.0")
    assert rows["p99 ms"].rstrip().endswith("37.5")
    assert "SLO p95 <= 500 ms" in out and "met (25.0 ms)" in out
    assert oip.n == 20


def test_cli_json_output(servers: tuple[str, str, Oip], capsys: pytest.CaptureFixture[str]) -> None:
    cp, gw, oip = servers
    args = _root(["--app", "cam", "--duration", "0.5", "--rate", "30", "--arrivals", "poisson", "--server", cp,
                  "--json"])
    assert args.func(args) == 0
    d = strict_json(capsys.readouterr().out)
    assert d["mode"] == "controlplane" and d["gateway"] == gw and d["control_plane"] == cp
    r = d["report"]
    assert r["arrivals"] == "poisson" and r["offered_rps"] == 30 and r["sent"] == r["ok"] == oip.n
    assert r["slo"]["stat"] == "p95" and r["slo"]["latency_ms"] == 500
    assert d["predicted"]["mean_ms"] == pytest.approx(12.5) and d["predicted"]["p99_ms"] == pytest.approx(37.5)
    assert d["predicted"]["slo_met"] is True
    by_dev = {x["device"]: x for x in d["devices"]}
    assert by_dev["node-2/cpu0"]["emulated"] is False  # unknown to the control plane; the agent said real
    assert by_dev["node-2/cpu0"]["observed"]["ok"] > 0
    assert by_dev["node-1/tpu0"]["emulated"] is True
    observed = sum(x["observed"]["ok"] for x in d["devices"] if x["observed"])
    assert observed == r["ok"]


def test_cli_gateway_only_is_observed_only(servers: tuple[str, str, Oip], capsys: pytest.CaptureFixture[str]) -> None:
    _, gw, _ = servers
    args = _root(["--app", "cam", "--duration", "0.3", "--rate", "20", "--gateway", gw, "--json"])
    assert args.func(args) == 0
    d = strict_json(capsys.readouterr().out)
    assert d["mode"] == "gateway" and d["predicted"] is None and d["devices"] is None and d["control_plane"] is None
    args = _root(["--app", "cam", "--duration", "0.3", "--rate", "20", "--gateway", gw])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    mean_row = next(line for line in out.splitlines() if line.startswith("mean ms"))
    assert mean_row.rstrip().endswith("-")


@pytest.mark.parametrize("argv,needle", [
    (["--rate", "-1", "--duration", "1"], "--rate"),
    (["--rate", "10", "--duration", "0"], "--duration"),
    (["--rate", "10", "--duration", "1", "--arrivals", "bursty"], "--arrivals"),
    (["--duration", "1"], "--rate"),  # only --gateway: the rate cannot come from anywhere
    (["--rate", "10", "--duration", "1", "--slo-stat", "p90"], "--slo-stat"),
])
def test_cli_bad_arguments_exit_2_with_one_line(argv: list[str], needle: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    args = _root(["--app", "cam", "--gateway", "http://127.0.0.1:9", *argv])
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("edgemux: error: ") and needle in err


def test_cli_unreachable_server_and_gateway_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    dead = _refused_url()
    for argv in (["--server", dead], ["--gateway", dead, "--rate", "10"]):
        args = _root(["--app", "cam", "--duration", "0.2", *argv])
        assert args.func(args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("edgemux: error: ") and dead in err


def test_cli_unknown_app_exit_2(servers: tuple[str, str, Oip], capsys: pytest.CaptureFixture[str]) -> None:
    cp, _, oip = servers
    args = _root(["--app", "nope", "--duration", "0.2", "--server", cp])
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown app 'nope'" in err
    assert oip.n == 0
