"""Typed messages between services (runtime.messages and each subsystem's messages) and the one client of the
control plane's API (runtime.controlplane.apiclient): round trips, and malformed messages and answers named."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from edgemux.cluster.state import Placement, Share
from edgemux.runtime.controlplane.apiclient import ApiError, ApiUnreachable, ControlPlaneClient, call
from edgemux.runtime.controlplane.messages import (
    AgentView,
    ApplyAnswer,
    ApplyResult,
    AppView,
    MoveAnswer,
    MoveRequest,
    MoveTarget,
    PendingPiece,
    RejectionView,
    RouteEndpoint,
    RouteView,
    placement_from_json,
    placement_to_json,
)
from edgemux.runtime.dataplane.messages import AgentReport, PieceReport
from edgemux.runtime.ingress.routing import AppRoute, Endpoint, RouteError
from edgemux.runtime.messages import MessageError

PLACEMENT = Placement("cam", (Share("n1/tpu0", 0.6, "ibis-edgetpu/mobilenet_v2"),
                              Share("n2/tpu0", 0.4, "ibis-edgetpu/mobilenet_v2")), "n1")
REPORT = AgentReport("n1", "http://127.0.0.1:9001", "inc-1", 0.5, "0.1.0",
                     {"tpu0": {"name": "tpu0", "emulated": True}},
                     (PieceReport("cam", "tpu0", "zoo:mobilenet_v2@224", "ibis-edgetpu/mobilenet_v2", 1.0,
                                  10.0, 2.0, {"backend": "emulated"}),),
                     {"cpu_cores": 4}, runs_on="ray node 9f3c at 10.0.0.7")
ROUTE = RouteView("cam", "cam", (RouteEndpoint("http://127.0.0.1:9001", 0.6, "n1", "n1/tpu0"),),
                  30.0, 5.0, (PendingPiece("n2", "n2/tpu0", 0.4, "not loaded yet"),))

ROUND_TRIPS: list[tuple[Any, Any]] = [
    (REPORT, lambda d: AgentReport.from_json(d, "n1")),
    (ROUTE, RouteView.from_json),
    (ApplyAnswer((ApplyResult("cam", "created", "pending", PLACEMENT),
                  ApplyResult("big", "rejected", rejection=RejectionView("slo", "big: p99 31 ms > 30 ms",
                                                                         {"tenant": "cam"}))), 409),
     lambda d: ApplyAnswer.from_json(d, 409)),
    (MoveRequest((MoveTarget("n1/tpu1", 0.5), MoveTarget("n2/tpu0", 0.5)), "n2"), MoveRequest.from_json),
    (MoveAnswer("cam", "moved", PLACEMENT, Placement("cam", (Share("n2/tpu1", 1.0, "p"),), None),
                {"load_s": 0.13, "switch_s": 0.003, "drain_s": 1.0}), MoveAnswer.from_json),
    (AppView("cam", "mobilenet_v2", 30.0, True, 5.0, 50.0, "p99", "ready", PLACEMENT), AppView.from_json),
    (AgentView("n1", "http://127.0.0.1:9001", "inc-1", None, 0.5, 0.25, True, ("cam",), ("tpu0",)),
     AgentView.from_json),
    (AgentView("n1", "http://127.0.0.1:9001", "inc-1", None, 0.5, 0.25, True, ("cam",), ("tpu0",), "edge-box-1"),
     AgentView.from_json),
]


@pytest.mark.parametrize("msg,read", ROUND_TRIPS, ids=lambda x: type(x).__name__)
def test_round_trip_through_json_text(msg: Any, read: Any) -> None:
    """to_json, through JSON text and back, is the same message (extras included where a message keeps them)."""
    again = read(json.loads(json.dumps(msg.to_json())))
    assert again == msg


def test_placement_round_trip_and_a_bad_weight_named() -> None:
    assert placement_from_json("cam", placement_to_json(PLACEMENT)) == PLACEMENT
    doc = placement_to_json(PLACEMENT)
    doc["shares"][1]["weight"] = "0.4"
    with pytest.raises(MessageError, match=r"placement\.shares\[1\]\.weight: expected a finite number, got string"):
        placement_from_json("cam", doc)
    doc["shares"][1]["weight"] = 0.5  # 0.6 + 0.5: not a placement
    with pytest.raises(MessageError, match="placement"):
        placement_from_json("cam", doc)


def test_agent_report_keeps_extras_and_refuses_what_the_control_plane_cannot_use() -> None:
    d = REPORT.to_json()
    assert d["cpu_cores"] == 4 and d["apps"][0]["backend"] == "emulated"
    assert REPORT.by_app() == {"cam": [REPORT.pieces[0]]}
    bad = {k: v for k, v in d.items() if k != "incarnation"}
    with pytest.raises(MessageError, match=r"registration\.incarnation: missing"):
        AgentReport.from_json(bad, "n1")
    with pytest.raises(MessageError, match="URL names node n2"):
        AgentReport.from_json(d, "n2")
    with pytest.raises(MessageError, match=r"registration\.heartbeat_s: must be > 0"):
        AgentReport.from_json({**d, "heartbeat_s": 0}, "n1")
    with pytest.raises(MessageError, match=r"registration\.apps\[0\]\.weight"):
        AgentReport.from_json({**d, "apps": [{**d["apps"][0], "weight": True}]}, "n1")
    with pytest.raises(MessageError, match=r"registration\.apps\[0\]\.rate_rps: expected a finite number"):
        AgentReport.from_json({**d, "apps": [{**d["apps"][0], "rate_rps": "10"}]}, "n1")
    with pytest.raises(MessageError, match=r"registration\.devices\[0\]: expected a JSON object, got array"):
        AgentReport.from_json({**d, "devices": [[]]}, "n1")
    # where it runs: optional (an older agent does not say), a string of at most 200 characters
    assert AgentReport.from_json({k: v for k, v in d.items() if k != "runs_on"}, "n1").runs_on is None
    with pytest.raises(MessageError, match=r"registration\.runs_on: expected a non-empty string"):
        AgentReport.from_json({**d, "runs_on": 7}, "n1")
    with pytest.raises(MessageError, match=r"registration\.runs_on: longer than 200 characters"):
        AgentReport.from_json({**d, "runs_on": "x" * 201}, "n1")


def test_route_view_gives_the_route_a_gateway_holds_only_with_an_endpoint() -> None:
    route = ROUTE.app_route()
    assert route == AppRoute("cam", "cam", [(Endpoint("n1/tpu0", "http://127.0.0.1:9001"), 0.6)], 30.0, 5.0)
    assert AppRoute.from_json("cam", route.to_json()) == route
    assert RouteView("cam", "cam", (), 30.0, 5.0, ROUTE.pending).app_route() is None
    with pytest.raises(MessageError, match=r"route\.endpoints\[0\]\.url: missing"):
        RouteView.from_json({**ROUTE.to_json(), "endpoints": [{"weight": 1.0, "node": "n1", "device": "d"}]})
    with pytest.raises(RouteError, match="rate_rps"):
        AppRoute.from_json("cam", {**route.to_json(), "rate_rps": -1})


def test_move_request_shape_errors_name_the_part() -> None:
    for doc, needle in [({"to": []}, "'to' must be a non-empty list"),
                        ({"to": ["n1/tpu0"], "where": 1}, "a move must be a JSON object"),
                        ({"to": ["n1/tpu0", "n1/tpu0"]}, "names device n1/tpu0 twice"),
                        ({"to": [{"device": "n1/tpu0", "weight": 0.5}, "n2/tpu0"]}, "for every device or for none"),
                        ({"to": [{"device": "n1/tpu0", "weight": 1.5}]}, r"'to\[0\]\.weight' must be a number in \(0, 1\]"),
                        ({"to": ["n1/tpu0"], "cpu_node": ""}, "'cpu_node' must be a node name")]:
        with pytest.raises(MessageError, match=needle):
            MoveRequest.from_json(doc)
    assert MoveRequest.from_json({"to": ["n1/tpu0"]}) == MoveRequest((MoveTarget("n1/tpu0"),))


def test_apply_result_rejection_goes_with_result_rejected() -> None:
    with pytest.raises(MessageError, match="result 'rejected'"):
        ApplyResult.from_json({"app": "a", "result": "rejected"})
    with pytest.raises(MessageError, match="expected one of created, updated, unchanged, rejected"):
        ApplyResult.from_json({"app": "a", "result": "admitted"})
    body = ApplyAnswer((ApplyResult("b", "rejected", rejection=RejectionView("memory", "no room")),)).to_json()
    assert body["error"] == "no room" and body["rejected"] == 1 and body["applied"] == 0


# ------------------------------------------------------------------------------------------- the client


class _Canned(BaseHTTPRequestHandler):
    """Answers each path with what ``ANSWERS`` holds: (status, raw body)."""

    ANSWERS: dict[tuple[str, str], tuple[int, bytes]] = {}
    SEEN: list[tuple[str, str, bytes]] = []

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.SEEN.append((self.command, self.path, self.rfile.read(length)))
        status, body = self.ANSWERS.get((self.command, self.path), (404, b'{"error": "no such path"}'))
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def canned():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Canned)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Canned.ANSWERS, _Canned.SEEN = {}, []
    yield f"http://127.0.0.1:{server.server_address[1]}", _Canned
    server.shutdown()
    server.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_client_reads_typed_answers(canned) -> None:
    url, h = canned
    h.ANSWERS = {
        ("GET", "/v1/routes/cam"): (200, json.dumps(ROUTE.to_json()).encode()),
        ("GET", "/v1/apps"): (200, json.dumps({"apps": [ROUND_TRIPS[5][0].to_json()]}).encode()),
        ("GET", "/v1/gateways"): (200, b'{"gateways": [{"url": "http://g:1", "last_error": null}]}'),
        ("POST", "/v1/apps"): (409, json.dumps(ROUND_TRIPS[2][0].to_json()).encode()),
        ("POST", "/v1/apps/cam/move"): (200, json.dumps(ROUND_TRIPS[4][0].to_json()).encode()),
    }
    cp = ControlPlaneClient(url + "/", timeout_s=5.0)
    assert cp.route("cam") == ROUTE
    assert cp.app_route("cam") == ROUTE.app_route()
    assert cp.app_route("nope") is None  # 404: unknown to the control plane
    assert [a.name for a in cp.apps()] == ["cam"] and cp.wait_ready(["cam"], 0.0) == []
    assert cp.gateways() == ["http://g:1"]
    applied = cp.apply(b"kind: App")
    assert applied.http_status == 409 and [r.app for r in applied.rejected] == ["big"]
    moved = cp.move("cam", MoveRequest((MoveTarget("n2/tpu1"),)))
    assert moved.result == "moved" and moved.steps_s["drain_s"] == 1.0
    assert json.loads(h.SEEN[-1][2]) == {"to": [{"device": "n2/tpu1"}]}


def test_client_errors_are_one_line_and_name_the_call(canned) -> None:
    url, h = canned
    h.ANSWERS = {("GET", "/v1/apps/x"): (200, b"<html>proxy</html>"),
                 ("DELETE", "/v1/apps/x"): (404, b'{"error": "unknown app \'x\' (apps: none)"}'),
                 ("GET", "/v1/routes/x"): (200, b'{"app": "x"}')}
    cp = ControlPlaneClient(url, timeout_s=5.0)
    with pytest.raises(ApiError, match="HTTP 200 with a body that is not JSON"):
        cp.describe("x")
    with pytest.raises(ApiError, match="delete app x: unknown app 'x'") as e:
        cp.delete("x")
    assert e.value.status == 404
    with pytest.raises(MessageError, match="route.endpoints: missing"):
        cp.route("x")
    assert call("DELETE", url + "/v1/apps/x", timeout_s=5.0).status == 404  # call: an error status is data
    with pytest.raises(ApiUnreachable, match=r"cannot reach the control plane at http://127\.0\.0\.1:\d+: "):
        ControlPlaneClient(f"http://127.0.0.1:{_free_port()}", timeout_s=2.0).apps()
