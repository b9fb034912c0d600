"""Authentication (runtime.auth): the admin token and app keys on the control plane, the agents and the
gateway. Every control route of each service refuses a missing or wrong credential (401, JSON, with a Bearer
challenge) and an app key (403) before any handler runs; an app key opens its own app's inference and no other
(403); an agent takes a key only when it takes app keys; the control plane issues a key at creation, once, and
rotates it (the old one stops at the gateway); an agent loads ONNX files only from its directories; tritonclient
sends a key unmodified. The pieces: the guard's decisions, bearer parsing and the token file's permissions."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgemux.cluster.specs import parse_cluster
from edgemux.errors import InputError
from edgemux.runtime.auth import (
    ADMIN,
    OPEN,
    TOKEN_ENV,
    TOKEN_FILE_ENV,
    AuthError,
    Guard,
    Need,
    bearer,
    digest,
    new_app_key,
    read_token_file,
    resolve_token,
    write_token_file,
)
from edgemux.runtime.controlplane.api import make_app as controlplane_app
from edgemux.runtime.dataplane.agent import Agent
from edgemux.runtime.dataplane.agent import make_app as agent_app
from edgemux.runtime.dataplane.backends import ModelSource
from edgemux.runtime.ingress.gateway import Gateway
from edgemux.runtime.ingress.gateway import make_app as gateway_app
from edgemux.runtime.httpserver import Application, Handler, Request, Response
from edgemux.runtime.ingress.routing import AppRoute
from support import TWO_TPUS_YAML, LoopThread, serve_app
from test_runtime_agent import CPU_MODEL, TPU_MODEL, TPU_PROFILE, Served, _infer_binary, _node, _tpu_x
from test_runtime_controlplane import TWO_TPUS, Env, Loop, app_yaml, http
from test_runtime_engine import wait_for

TOKEN = "t0ken-for-tests"


def call(method: str, url: str, token: str | None = None, body: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
    """(status, headers, JSON body or None)."""
    h = dict(headers or {})
    if token is not None:
        h["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=body, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, hdrs, raw = r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        status, hdrs, raw = e.code, dict(e.headers), e.read()
    try:
        return status, hdrs, json.loads(raw) if raw else None
    except ValueError:
        return status, hdrs, None


def route_paths(app: Application) -> list[tuple[str, str]]:
    """Every (method, path) the application routes, its placeholders filled in."""
    out = []
    for r in app.routes:
        path = r.path
        for name in ("{name}", "{app}", "{node}", "{device}", "{version}"):
            path = path.replace(name, "x")
        out.append((r.method, path))
    return sorted(set(out))


def assert_refused_without_credentials(base: str, paths: list[tuple[str, str]], app_key: str) -> None:
    """Each path: 401 with a Bearer challenge and a JSON error without a token, with a malformed header and
    with a wrong token; 403 with ``app_key``, a key the service knows (a valid credential that does not open a
    control API)."""
    for method, path in paths:
        for token, headers in ((None, None), ("wrong", None), (None, {"Authorization": "Basic dXNlcg=="})):
            status, hdrs, body = call(method, base + path, token, headers=headers)
            assert status == 401, (method, path, token, status, body)
            assert hdrs.get("WWW-Authenticate", "").startswith("Bearer"), (method, path)
            assert isinstance(body, dict) and body["error"], (method, path)
        status, _, body = call(method, base + path, app_key)
        assert status == 403 and "app key" in body["error"], (method, path, status, body)


# ------------------------------------------------------------------------------------------ the pieces


def test_the_guards_decisions() -> None:
    keys = {"a": digest("key-a"), "b": digest("key-b")}
    owner = {d: app for app, d in keys.items()}
    g = Guard(TOKEN, keys.get, owner.get)
    g.check(OPEN, None)                            # open paths need nothing
    g.check(ADMIN, f"Bearer {TOKEN}")
    g.check(Need(app="a"), f"Bearer {TOKEN}")      # the admin token opens every app
    g.check(Need(app="a"), "bearer key-a")         # the scheme is case-insensitive
    cases = [(ADMIN, None, 401, "missing credentials"), (ADMIN, "Bearer nope", 401, "invalid token"),
             (ADMIN, "Bearer key-a", 403, "app key opens only"), (ADMIN, "Token x", 401, "must be 'Bearer"),
             (ADMIN, "Bearer ", 401, "must be 'Bearer"), (Need(app="a"), "Bearer key-b", 403, "not app a's"),
             (Need(app="a"), "Bearer nope", 401, "invalid token"), (Need(app="c"), "Bearer key-a", 403, "not app c's"),
             (Need(app="a"), None, 401, "app a's key")]
    for need, header, status, words in cases:
        with pytest.raises(AuthError, match=words) as e:
            g.check(need, header)
        assert e.value.status == status, (need, header)
    no_keys = Guard(TOKEN, keys.get, owner.get, app_keys=False)
    with pytest.raises(AuthError, match="only with the cluster's admin token") as e:
        no_keys.check(Need(app="a"), "Bearer key-a")
    assert e.value.status == 403
    Guard(None).check(ADMIN, None)  # no token: open
    with pytest.raises(InputError):
        Guard("two words")


def test_bearer_and_keys() -> None:
    assert bearer(None) is None and bearer("Bearer  abc ") == "abc"
    k1, k2 = new_app_key(), new_app_key()
    assert k1.startswith("emk_") and k1 != k2 and len(k1) > 40
    assert digest(k1) == digest(k1) != digest(k2) and len(digest(k1)) == 64


def test_the_token_file_is_its_owners_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "token"
    token = write_token_file(path)
    assert path.stat().st_mode & 0o777 == 0o600 and read_token_file(path) == token
    os.chmod(path, 0o644)
    with pytest.raises(InputError, match=r"others can access it \(mode 0644\).*chmod 600"):
        read_token_file(path)
    with pytest.raises(InputError, match="no such file"):
        read_token_file(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    os.chmod(empty, 0o600)
    with pytest.raises(InputError, match="one token on one line"):
        read_token_file(empty)
    os.chmod(path, 0o600)
    assert resolve_token(str(path), {}) == token
    assert resolve_token(None, {TOKEN_FILE_ENV: str(path), TOKEN_ENV: "other"}) == token
    assert resolve_token(None, {TOKEN_ENV: " direct "}) == "direct"
    assert resolve_token(None, {}) is None


# ------------------------------------------------------------------------------------------ control plane


@pytest.fixture
def loop() -> Iterator[Loop]:
    lp = Loop()
    yield lp
    lp.close()


def test_every_control_plane_route_needs_the_admin_token(loop: Loop, tmp_path: Path) -> None:
    env = Env(loop, tmp_path, parse_cluster(TWO_TPUS))
    env.stop()
    env.start(token=TOKEN)
    try:
        assert http("GET", f"{env.url}/v1/apps", token=TOKEN) == (200, {"apps": []})
        status, body = http("POST", f"{env.url}/v1/apps", app_yaml("cam", 5), "application/yaml", token=TOKEN)
        assert status == 201, body
        # all but the dashboard's static files, which carry no data and are open (tests/test_dashboard.py)
        paths = [p for p in route_paths(controlplane_app(env.cp)) if not p[1].startswith("/dashboard")]
        assert len(paths) >= 18 and all(p.startswith("/v1") or p == "/metrics" for _, p in paths)
        assert ("GET", "/metrics") in paths
        assert_refused_without_credentials(env.url, paths, body["results"][0]["key"])
        assert http("GET", f"{env.url}/v1/apps/cam", token=TOKEN)[0] == 200
    finally:
        env.stop()


def test_an_app_gets_a_key_once_and_rotation_replaces_it_everywhere(loop: Loop, tmp_path: Path) -> None:
    env = Env(loop, tmp_path, parse_cluster(TWO_TPUS))
    env.stop()
    env.start(token=TOKEN)
    try:
        for n in env.agents:
            status, _ = http("POST", f"{env.url}/v1/agents/{n}", env.agents[n].registration().to_json(), token=TOKEN)
            assert status == 200
        assert http("POST", f"{env.url}/v1/gateways", {"url": env.gateway.url}, token=TOKEN)[0] == 200
        status, body = http("POST", f"{env.url}/v1/apps", app_yaml("cam", 5), "application/yaml", token=TOKEN)
        assert status == 201, body
        key = body["results"][0]["key"]
        assert key.startswith("emk_")
        env.idle()
        # the gateway's route and the agent's piece carry the key's digest, never the key
        assert env.gateway.routes["cam"]["key_sha256"] == digest(key)
        node = next(n for n, a in env.agents.items() if "cam" in a.apps)
        assert env.agents[node].puts()[-1][1]["key_sha256"] == digest(key)
        assert key not in json.dumps(env.dump()) and digest(key) in json.dumps(env.dump())
        # the same spec again: unchanged, and no new key is shown
        status, body = http("POST", f"{env.url}/v1/apps", app_yaml("cam", 5), "application/yaml", token=TOKEN)
        assert status == 200 and "key" not in body["results"][0]
        # rotation: a new key; the gateway and the agent get its digest
        status, body = http("POST", f"{env.url}/v1/apps/cam/key", token=TOKEN)
        assert status == 200 and body["app"] == "cam" and body["key"] != key
        new = body["key"]
        # by the time rotation answers, the agent holds the new digest and then the gateway: the route never
        # went away meanwhile (a route is published only for pieces their agent holds)
        assert env.agents[node].puts()[-1][1]["key_sha256"] == digest(new)
        assert env.gateway.routes["cam"]["key_sha256"] == digest(new)
        assert ("DELETE", "cam", None) not in env.gateway.calls
        assert http("POST", f"{env.url}/v1/apps/nope/key", token=TOKEN)[0] == 404
    finally:
        env.stop()
    # an open control plane issues no keys and has none to rotate
    env.start()
    try:
        status, body = http("POST", f"{env.url}/v1/apps/cam/key")
        assert status == 409 and "authentication is off" in body["error"]
    finally:
        env.stop()


# --------------------------------------------------------------------------------------------- agent


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[Served]:
    served = Served(Agent(_node(), cache_dir=str(tmp_path / "cache"), token=TOKEN,
                          model_dirs=[str(tmp_path / "models")]))
    yield served
    served.stop()


def test_every_agent_control_route_needs_the_admin_token(guarded: Served) -> None:
    key = new_app_key()
    assert guarded.json("PUT", "/v1/apps/a", {"device": "tpu0", "model": TPU_MODEL, "profile": TPU_PROFILE,
                                              "key_sha256": digest(key)}, token=TOKEN)[0] == 201
    paths = [(m, p) for m, p in route_paths(agent_app(guarded.agent)) if not p.startswith("/v2")]
    assert ("GET", "/metrics") in paths and ("PUT", "/v1/apps/x") in paths
    assert_refused_without_credentials(f"http://{guarded.hostport}", paths, key)
    # health and server metadata stay open (a load balancer's probe)
    for path in ("/v2/health/live", "/v2/health/ready", "/v2"):
        assert guarded.call("GET", path)[0] == 200, path


def test_an_app_key_opens_its_own_app_at_the_agent_and_no_other(guarded: Served) -> None:
    ka, kb = new_app_key(), new_app_key()
    for app, key in (("a", ka), ("b", kb)):
        status, body = guarded.json("PUT", f"/v1/apps/{app}", {"device": "tpu0", "model": TPU_MODEL,
                                                             "profile": TPU_PROFILE, "key_sha256": digest(key)},
                                    token=TOKEN)
        assert status == 201, body
    body, hdrs = _infer_binary(_tpu_x(1))

    def infer(app: str, token: str | None) -> int:
        h = dict(hdrs, **({"Authorization": f"Bearer {token}"} if token else {}))
        return guarded.call("POST", f"/v2/models/{app}/infer", body, h)[0]

    assert infer("a", ka) == 200 and infer("b", kb) == 200 and infer("a", TOKEN) == 200
    assert infer("a", kb) == 403 and infer("b", ka) == 403
    assert infer("a", None) == 401 and infer("a", new_app_key()) == 401
    assert guarded.call("GET", "/v2/models/a/ready", None, {"Authorization": f"Bearer {ka}"})[0] == 200
    # the agent reports the digest with the piece, never the key
    status, apps = guarded.json("GET", "/v1/apps", token=TOKEN)
    assert {a["app"]: a["key_sha256"] for a in apps["apps"]} == {"a": digest(ka), "b": digest(kb)}
    status, err = guarded.json("PUT", "/v1/apps/c", {"device": "tpu0", "model": TPU_MODEL, "key_sha256": "ab"},
                               token=TOKEN)
    assert status == 400 and "64 lowercase hex digits" in err["error"]


def test_an_agent_without_app_keys_takes_only_the_admin_token(tmp_path: Path) -> None:
    served = Served(Agent(_node(cpu=False), cache_dir=str(tmp_path), token=TOKEN, app_keys=False))
    try:
        key = new_app_key()
        assert served.json("PUT", "/v1/apps/a", {"device": "tpu0", "model": TPU_MODEL, "profile": TPU_PROFILE,
                                                 "key_sha256": digest(key)}, token=TOKEN)[0] == 201
        body, hdrs = _infer_binary(_tpu_x(1))
        status, _, raw = served.call("POST", "/v2/models/a/infer", body, dict(hdrs, Authorization=f"Bearer {key}"))
        assert status == 403 and b"only with the cluster's admin token" in raw
        assert served.call("POST", "/v2/models/a/infer", body, dict(hdrs, Authorization=f"Bearer {TOKEN}"))[0] == 200
    finally:
        served.stop()


def test_an_agent_loads_onnx_files_only_from_its_directories(guarded: Served, tmp_path: Path) -> None:
    built = dataclasses.replace(ModelSource.parse(CPU_MODEL), cache_dir=str(tmp_path / "cache")).onnx_path()
    allowed, outside = tmp_path / "models", tmp_path / "elsewhere"
    allowed.mkdir()
    outside.mkdir()
    shutil.copy(built, allowed / "sq.onnx")
    shutil.copy(built, outside / "sq.onnx")
    (allowed / "link.onnx").symlink_to(outside / "sq.onnx")  # a link out of the directory is still outside
    for path in (outside / "sq.onnx", allowed / "link.onnx", allowed / ".." / "elsewhere" / "sq.onnx"):
        status, err = guarded.json("PUT", "/v1/apps/sq", {"device": "cpu0", "model": str(path)}, token=TOKEN)
        assert status == 403 and "outside the directories this agent loads ONNX files from" in err["error"], err
    status, body = guarded.json("PUT", "/v1/apps/sq", {"device": "cpu0", "model": str(allowed / "sq.onnx")},
                                token=TOKEN)
    assert status == 201, body
    # a zoo model is always allowed
    assert guarded.json("PUT", "/v1/apps/z", {"device": "cpu0", "model": CPU_MODEL}, token=TOKEN)[0] == 201


# ------------------------------------------------------------------------------------------- gateway


@pytest.fixture(scope="module")
def loop_thread() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    lt.stop()


def test_the_gateway_takes_each_apps_key_for_that_app_only(guarded: Served, loop_thread: LoopThread) -> None:
    """A gateway with the cluster's token in front of an agent with the same token: the client's key opens
    its app at the gateway, which sends the admin token on to the agent; tritonclient sends the key as a
    header, unmodified."""
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    ka, kb = new_app_key(), new_app_key()
    agent_url = f"http://{guarded.hostport}"
    routes = {}
    for app, key in (("a", ka), ("b", kb)):
        assert guarded.json("PUT", f"/v1/apps/{app}", {"device": "tpu0", "model": TPU_MODEL, "profile": TPU_PROFILE,
                                                       "key_sha256": digest(key)}, token=TOKEN)[0] == 201
        routes[app] = AppRoute(app, app, [(agent_url, 1.0)], 1e6, 1e6, key_sha256=digest(key))
    gateway = Gateway(routes, token=TOKEN)
    runner, url = loop_thread.run(serve_app(gateway_app(gateway)))
    try:
        paths = [(m, p) for m, p in route_paths(gateway_app(Gateway({}))) if not p.startswith("/v2")]
        assert ("PUT", "/v1/routes/x") in paths and ("GET", "/metrics") in paths
        assert_refused_without_credentials(url, paths, ka)
        body, hdrs = _infer_binary(_tpu_x(1))
        for app, token, want in (("a", ka, 200), ("b", kb, 200), ("a", TOKEN, 200), ("a", kb, 403),
                                 ("b", ka, 403), ("a", None, 401), ("a", "emk_unknown", 401), ("nope", ka, 403)):
            status, _, answer = call("POST", f"{url}/v2/models/{app}/infer", token, body, hdrs)
            assert status == want, (app, token, status, answer)
        client = httpclient.InferenceServerClient(url=url.removeprefix("http://"), connection_timeout=30,
                                                  network_timeout=30)
        try:
            assert client.is_server_live()  # open
            inp = httpclient.InferInput("input", [1, 32, 32, 3], "UINT8")
            inp.set_data_from_numpy(_tpu_x(1))
            out = client.infer("a", [inp], headers={"Authorization": f"Bearer {ka}"})
            assert out.as_numpy("logits").shape == (1, 1000)
            with pytest.raises(InferenceServerException, match="missing credentials"):
                client.infer("a", [inp])
            with pytest.raises(InferenceServerException, match="not app a's"):
                client.infer("a", [inp], headers={"Authorization": f"Bearer {kb}"})
        finally:
            client.close()
        # a rotated key: the route's new digest opens it, the old key no longer does
        new = new_app_key()
        gateway.update_routes("a", AppRoute("a", "a", [(agent_url, 1.0)], 1e6, 1e6, key_sha256=digest(new)))
        assert call("POST", f"{url}/v2/models/a/infer", ka, body, hdrs)[0] == 401
        # (the agent still holds the old digest: the gateway sends the admin token, not the client's key)
        assert call("POST", f"{url}/v2/models/a/infer", new, body, hdrs)[0] == 200
    finally:
        loop_thread.run(runner.stop())


def test_the_python_client_sends_each_apps_key_and_follows_a_move_past_a_401(guarded: Served,
                                                                               tmp_path: Path) -> None:
    """``Client(keys=...)`` sends the app's key to the agents; after a move the old agent no longer knows
    the app's key (401, not 404): the client asks for the route again and is served at the new agent."""
    from edgemux.runtime.ingress.client import Client
    from edgemux.runtime.ingress.dispatch import RequestError

    other = Served(Agent(_node(cpu=False), cache_dir=str(tmp_path / "c2"), token=TOKEN))
    try:
        key = new_app_key()
        spec = {"device": "tpu0", "model": TPU_MODEL, "profile": TPU_PROFILE, "key_sha256": digest(key)}
        assert guarded.json("PUT", "/v1/apps/a", spec, token=TOKEN)[0] == 201
        old = AppRoute("a", "a", [(f"http://{guarded.hostport}", 1.0)], 1e6, 1e6)
        new = AppRoute("a", "a", [(f"http://{other.hostport}", 1.0)], 1e6, 1e6)
        current = [old]
        client = Client(lambda app: current[0], keys={"a": key})
        x = {"input": _tpu_x(1)}
        assert client.infer("a", x).endpoint == f"http://{guarded.hostport}"
        # the move: loaded on the other agent, the route switched, unloaded from the first
        assert other.json("PUT", "/v1/apps/a", spec, token=TOKEN)[0] == 201
        current[0] = new
        assert guarded.json("DELETE", "/v1/apps/a", token=TOKEN)[0] == 200
        assert client.infer("a", x).endpoint == f"http://{other.hostport}"
        client.close()
        # without a key the agent refuses, and the route, looked up again, is the same: the 401 stands
        bare = Client(lambda app: new)
        with pytest.raises(RequestError, match="401: missing credentials"):
            bare.infer("a", x)
        # a bare array needs the model's metadata, which a keyless client is refused too: the error says
        # that, not that the model declares no single input
        with pytest.raises(RequestError, match="401: missing credentials.*no key for the app"):
            bare.infer("a", _tpu_x(1))
        bare.close()
        wrong = Client(lambda app: new, keys={"a": new_app_key()})
        with pytest.raises(RequestError, match="the key given for the app is not its key"):
            wrong.infer("a", _tpu_x(1))
        wrong.close()
    finally:
        other.stop()


# ------------------------------------------------------------------------------------------------- TLS


def test_tls_options_are_checked(tmp_path: Path) -> None:
    from edgemux.runtime.tls import make_local_ca, server_options

    assert server_options(None, None) is None
    with pytest.raises(InputError, match="needs both --tls-cert and --tls-key"):
        server_options(str(tmp_path / "c.pem"), None)
    with pytest.raises(InputError, match="no such file"):
        server_options(str(tmp_path / "c.pem"), str(tmp_path / "k.pem"))
    made = make_local_ca(tmp_path / "tls")
    assert made.key.stat().st_mode & 0o777 == 0o600
    assert server_options(str(made.cert), str(made.key)) is not None
    with pytest.raises(InputError, match="not a certificate and its key"):
        server_options(str(made.ca), str(made.key))  # the CA's certificate does not go with the server's key


def test_up_with_tls_serves_https_end_to_end_with_tritonclient(tmp_path: Path) -> None:
    """A local cluster with TLS and authentication (``Engine(tls=True)``, what ``edgemux up --tls`` runs):
    every service answers HTTPS only, verified against the cluster's CA; the control plane drives the agents and
    the gateway over it; tritonclient infers through the gateway over TLS with the app's key, unmodified
    (its standard ``ssl`` options and ``headers``); plain HTTP and an unverified CA get nowhere."""
    import ssl
    import tritonclient.http as httpclient

    from edgemux.engines.local import Engine
    from edgemux.runtime.tls import client_context

    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(TWO_TPUS_YAML)
    with Engine(cluster, listen_timeout_s=120.0, ready_timeout_s=120.0, heartbeat_s=0.5, tls=True) as eng:
        assert eng.ca is not None and eng.controlplane_url and eng.gateway_url
        assert eng.controlplane_url.startswith("https://") and eng.gateway_url.startswith("https://")
        assert all(u.startswith("https://") for u in eng.agent_urls.values())
        cp = eng.client()
        applied = cp.apply(app_yaml("cam", 5).encode())
        (result,) = applied.results
        assert result.result == "created" and result.key is not None
        assert cp.wait_ready(["cam"], 60.0) == []
        ctx = client_context(eng.ca)
        # plain HTTP to an HTTPS port, and HTTPS without trusting the CA: refused
        plain = eng.gateway_url.replace("https://", "http://")
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            urllib.request.urlopen(plain + "/v2/health/live", timeout=10).read()
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            urllib.request.urlopen(eng.gateway_url + "/v2/health/live", timeout=10,
                                   context=ssl.create_default_context()).read()

        def routed() -> bool:
            req = urllib.request.Request(eng.gateway_url + "/v1/routes",
                                         headers={"Authorization": f"Bearer {eng.token}"})
            with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
                return "cam" in json.loads(r.read())["routes"]

        wait_for("the gateway's route", routed)
        client = httpclient.InferenceServerClient(url=eng.gateway_url.removeprefix("https://"), ssl=True,
                                                  ssl_context_factory=lambda: client_context(eng.ca),
                                                  connection_timeout=30, network_timeout=30)
        try:
            meta = client.get_model_metadata("cam", headers={"Authorization": f"Bearer {result.key}"})
            shape = [1 if d < 0 else d for d in meta["inputs"][0]["shape"]]
            inp = httpclient.InferInput(meta["inputs"][0]["name"], shape, meta["inputs"][0]["datatype"])
            inp.set_data_from_numpy(_tpu_x(1, shape[1]) if meta["inputs"][0]["datatype"] == "UINT8"
                                    else np.zeros(shape, np.float32))
            out = client.infer("cam", [inp], headers={"Authorization": f"Bearer {result.key}"})
            assert out.get_response()["parameters"]["edgemux_emulated"] is True
        finally:
            client.close()


def test_a_control_plane_over_tls_is_verified_by_the_cli(loop: Loop, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI verifies an HTTPS control plane against $SSL_CERT_FILE: with the cluster's CA it works, without
    it the answer is one line naming the verification failure (exit 2), never an unverified call."""
    from edgemux.cli.main import main
    from edgemux.runtime.controlplane.api import start_server
    from edgemux.runtime.controlplane.service import ControlPlane
    from edgemux.runtime.tls import make_local_ca, server_context

    made = make_local_ca(tmp_path / "tls")
    cp = ControlPlane(str(tmp_path / "s.db"), parse_cluster(TWO_TPUS), token=TOKEN)
    server = loop.run(start_server(cp, "127.0.0.1", 0, ssl_context=server_context(made.cert, made.key)))
    try:
        assert server.url.startswith("https://127.0.0.1:")
        token = tmp_path / "token"
        token.write_text(TOKEN)
        os.chmod(token, 0o600)
        monkeypatch.delenv("SSL_CERT_FILE", raising=False)
        assert main(["get", "apps", "--server", server.url, "--token-file", str(token)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "CERTIFICATE_VERIFY_FAILED" in err, err
        monkeypatch.setenv("SSL_CERT_FILE", str(made.ca))
        assert main(["get", "apps", "--server", server.url, "--token-file", str(token), "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == {"apps": []}
    finally:
        loop.run(server.stop())


# --------------------------------------------------------------------------------------------- fuzzing


def _probe(seen: list[tuple[str, str, str | None]]) -> Any:
    """A middleware appended after the service's own (innermost, just before the handler): records every
    request that got past authentication, with its Authorization header."""

    async def probe(request: Request, handler: Handler) -> Response:
        seen.append((request.method, request.path, request.headers.get("Authorization")))
        return await handler(request)

    return probe


def _opens(path: str, header: str | None, keys: dict[str, str]) -> bool:
    """The test's own oracle, apart from the guard: whether ``header`` is a credential for ``path`` (health
    and server metadata open, and the control plane's dashboard files; an app's inference its key or the admin
    token; everything else the admin token; the shared-memory regions any valid credential, each its own)."""
    if path in ("/v2", "/v2/") or path.startswith("/v2/health/"):
        return True
    if path == "/dashboard" or (path.startswith("/dashboard/") and "/" not in path[len("/dashboard/"):]):
        return True  # the control plane's dashboard: static files without data, open (tests/test_dashboard.py)
    if header == f"Bearer {TOKEN}":
        return True
    if path.startswith("/v2/systemsharedmemory/"):
        return header in {f"Bearer {k}" for k in keys.values()}
    parts = path.split("/")
    if len(parts) > 3 and parts[1:3] == ["v2", "models"]:
        app = urllib.parse.unquote(parts[3])
        return app in keys and header == f"Bearer {keys[app]}"
    return False


_printable = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)


def _headers(keys: dict[str, str]) -> Any:
    """Authorization headers: none, the admin token, each app's key, and wrong and malformed ones."""
    good = [f"Bearer {TOKEN}", *(f"Bearer {k}" for k in keys.values())]
    return st.one_of(st.none(), st.sampled_from(good), st.sampled_from(["Bearer", "Bearer ", "Basic x", "bearer",
                                                                        f"Token {TOKEN}", f"Bearer {TOKEN}x",
                                                                        f"Bearer  {TOKEN[:-1]}", "Bearer emk_"]),
                     _printable, _printable.map(lambda s: "Bearer " + s))


def _fuzz_service(base: str, paths: list[tuple[str, str]], keys: dict[str, str], seen: list[Any],
                  examples: int = 150) -> None:
    """Whatever the path, method, body and credential: no 5xx, every 401/403 a JSON error, and no request
    that reached a handler lacked a credential for it."""
    segment = st.text(max_size=10).map(lambda s: urllib.parse.quote(s, safe=""))
    requests = st.one_of(
        st.sampled_from(paths), st.sampled_from(paths),
        st.tuples(st.sampled_from(paths), st.integers(1, 4), segment).map(
            lambda t: (t[0][0], "/".join(seg if i != t[1] else t[2] for i, seg in enumerate(t[0][1].split("/"))))))
    bodies = st.one_of(st.none(), st.binary(max_size=100), st.just(b'{"state": "off"}'))

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(request=requests, header=_headers(keys), body=bodies)
    def check(request: tuple[str, str], header: str | None, body: bytes | None) -> None:
        method, path = request
        seen.clear()
        status, hdrs, answer = call(method, base + path, None, body if method != "GET" else None,
                                    {"Authorization": header} if header is not None else None)
        assert status < 500, (method, path, header, status, answer)
        if status in (401, 403):
            assert isinstance(answer, dict) and answer["error"], (method, path, status)
        for m, p, h in seen:
            assert _opens(p, h, keys), ("reached a handler without a credential", m, p, h, status)

    check()


def test_fuzzing_the_authenticated_control_plane(tmp_path: Path, loop_thread: LoopThread) -> None:
    from edgemux.runtime.controlplane.service import ControlPlane

    cp = ControlPlane(str(tmp_path / "s.db"), parse_cluster(TWO_TPUS), token=TOKEN)
    seen: list[Any] = []
    app = controlplane_app(cp)
    app.middlewares.append(_probe(seen))
    runner, url = loop_thread.run(serve_app(app))
    try:
        status, _, body = call("POST", f"{url}/v1/apps", TOKEN, app_yaml("cam", 5).encode(),
                               {"Content-Type": "application/yaml"})
        assert status == 201, body
        keys = {"cam": body["results"][0]["key"]}
        _fuzz_service(url, route_paths(app) + [("GET", "/v1/apps/cam"), ("POST", "/v1/apps/cam/key")], keys, seen)
    finally:
        loop_thread.run(runner.stop())


def test_fuzzing_the_authenticated_agent_and_gateway(tmp_path: Path, loop_thread: LoopThread) -> None:
    agent = Agent(_node(cpu=False), cache_dir=str(tmp_path), token=TOKEN)
    seen: list[Any] = []
    app = agent_app(agent)
    app.middlewares.append(_probe(seen))
    runner, url = loop_thread.run(serve_app(app))
    key = new_app_key()
    keys = {"cam": key}
    try:
        spec = {"device": "tpu0", "model": TPU_MODEL, "profile": TPU_PROFILE, "key_sha256": digest(key)}
        assert call("PUT", f"{url}/v1/apps/cam", TOKEN, json.dumps(spec).encode())[0] == 201
        paths = route_paths(app) + [("POST", "/v2/models/cam/infer"), ("GET", "/v2/models/cam"),
                                    ("PUT", "/v1/devices/tpu0/power")]
        _fuzz_service(url, paths, keys, seen)
        gw_seen: list[Any] = []
        gateway = Gateway({"cam": AppRoute("cam", "cam", [(url, 1.0)], 1e6, 1e6, key_sha256=digest(key))},
                          token=TOKEN)
        gw_app = gateway_app(gateway)
        gw_app.middlewares.append(_probe(gw_seen))
        gw_runner, gw_url = loop_thread.run(serve_app(gw_app))
        try:
            paths = route_paths(gw_app) + [("POST", "/v2/models/cam/infer"), ("GET", "/v2/models/cam")]
            _fuzz_service(gw_url, paths, keys, gw_seen)
        finally:
            loop_thread.run(gw_runner.stop())
    finally:
        loop_thread.run(runner.stop())
        agent.close(drain=False, timeout_s=1.0)


# ---------------------------------------------------------------------------------------- CLI context


def test_the_cli_context_and_what_overrides_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``edgemux up`` writes the context; a client verb takes flag, then environment, then context, then the
    default, and the context's token only with the context's server (never sent to another one)."""
    from edgemux.runtime.controlplane.context import client_settings, context_path, remove_context, write_context

    monkeypatch.setenv("EDGEMUX_CONTEXT", str(tmp_path / "ctx" / "context.json"))
    for name in ("EDGEMUX_SERVER", "EDGEMUX_TOKEN_FILE", "EDGEMUX_TOKEN", "SSL_CERT_FILE"):
        monkeypatch.delenv(name, raising=False)
    assert client_settings(None, None).server == "http://127.0.0.1:8470"  # no context: the default
    token = tmp_path / "token"
    write_token_file(token)
    path = write_context("https://10.0.0.1:9000", str(token), None)
    assert path == context_path() and path.stat().st_mode & 0o777 == 0o600
    s = client_settings(None, None)
    assert s.server == "https://10.0.0.1:9000" and s.token == read_token_file(token)
    other = client_settings("http://elsewhere:1", None)
    assert other.server == "http://elsewhere:1" and other.token is None  # the context's token stays with it
    monkeypatch.setenv("EDGEMUX_SERVER", "http://env:2")
    assert client_settings(None, None).server == "http://env:2"
    monkeypatch.delenv("EDGEMUX_SERVER")
    remove_context("http://another:3")  # another cluster's stop leaves this one's context
    assert path.exists()
    remove_context("https://10.0.0.1:9000")
    assert not path.exists()
    path.write_text("{not json")
    with pytest.raises(InputError, match="not a readable context"):
        client_settings(None, None)
