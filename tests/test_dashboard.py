"""The control plane's dashboard routes (runtime.controlplane.dashboard): the page's static files are served
without a token, with their content types and the security headers; only those files (an unknown name is 404,
a path that tries to leave the folder is refused); the data the page shows still needs the admin token; an open
control plane serves both without one; the files are package data and fetch nothing from another origin. The
page itself, in a real browser against a real cluster: tests/test_dashboard_browser.py."""

from __future__ import annotations

import fnmatch
import http.client
import json
import re
import tomllib
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgemux.cluster.specs import parse_cluster
from edgemux.runtime.controlplane.api import start_server
from edgemux.runtime.controlplane.dashboard import ASSETS, SECURITY_HEADERS, asset, dashboard_url
from edgemux.runtime.controlplane.service import ControlPlane
from test_runtime_controlplane import TWO_TPUS, Loop

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "src" / "edgemux" / "runtime" / "controlplane" / "dashboard"
TOKEN = "dashboard-test-token"
CSP = "default-src 'self'; frame-ancestors 'none'"


def raw(base: str, method: str, path: str, token: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """(status, headers with lowercase names, body) of one request whose path goes out exactly as given."""
    u = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    try:
        conn.request(method, path, headers={"Authorization": f"Bearer {token}"} if token else {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


class Served:
    def __init__(self, loop: Loop, tmp: Path, token: str | None) -> None:
        self.loop = loop
        cp = ControlPlane(str(tmp / "store.db"), parse_cluster(TWO_TPUS), "edgemux", {}, token=token)
        self.server = loop.run(start_server(cp, "127.0.0.1", 0))
        self.url = self.server.url

    def stop(self) -> None:
        self.loop.run(self.server.stop())


@pytest.fixture
def loop() -> Iterator[Loop]:
    lp = Loop()
    yield lp
    lp.close()


@pytest.fixture
def guarded(loop: Loop, tmp_path: Path) -> Iterator[Served]:
    s = Served(loop, tmp_path, TOKEN)
    yield s
    s.stop()


def test_dashboard_url_carries_the_token_in_the_fragment_only() -> None:
    assert dashboard_url("http://127.0.0.1:8470", "abc_-DEF") == "http://127.0.0.1:8470/dashboard#token=abc_-DEF"
    assert dashboard_url("https://h:1/", None) == "https://h:1/dashboard"
    url = dashboard_url("http://h:1", "a/b+c=")
    assert urllib.parse.urlsplit(url).path == "/dashboard"
    assert urllib.parse.parse_qs(urllib.parse.urlsplit(url).fragment) == {"token": ["a/b+c="]}


def test_the_shell_is_served_without_a_token_with_the_security_headers(guarded: Served) -> None:
    for path in ("/dashboard", "/dashboard/"):
        status, headers, body = raw(guarded.url, "GET", path)
        assert status == 200, (path, body)
        assert headers["content-type"] == "text/html; charset=utf-8"
        assert headers["content-security-policy"] == CSP
        assert headers["x-content-type-options"] == "nosniff" and headers["referrer-policy"] == "no-referrer"
        found = asset("index.html")
        assert found is not None and body == found[0]
    for name, kind in ASSETS.items():
        status, headers, body = raw(guarded.url, "GET", f"/dashboard/{name}")
        assert status == 200 and headers["content-type"] == kind and body == (FOLDER / name).read_bytes(), name
        assert all(headers[k.lower()] == v for k, v in SECURITY_HEADERS.items()), name
        status, headers, body = raw(guarded.url, "HEAD", f"/dashboard/{name}")
        assert status == 200 and body == b"" and headers["content-type"] == kind
    assert {"text/javascript; charset=utf-8", "text/css; charset=utf-8"} <= set(ASSETS.values())


def test_only_the_pages_files_are_served(guarded: Served) -> None:
    status, _, body = raw(guarded.url, "GET", "/dashboard/nope.js")
    assert status == 404 and "no such dashboard file" in json.loads(body)["error"]
    secret = (ROOT / "src" / "edgemux" / "runtime" / "controlplane" / "dashboard.py").read_bytes()[:200]
    tries = ["/dashboard/dashboard.py", "/dashboard/..%2Fdashboard.py", "/dashboard/%2e%2e%2fapi.py",
             "/dashboard/../dashboard.py", "/dashboard/..%2F..%2F__init__.py", "/dashboard/%2Fetc%2Fpasswd",
             "/dashboard/index.html%00.js", "/dashboard/.%2Findex.html", "/dashboard/..", "/dashboard//index.html",
             "/dashboard/dashboard/index.html", "/dashboard%2F..%2Fv1%2Fapps"]
    for path in tries:
        for token in (None, TOKEN):
            status, _, body = raw(guarded.url, "GET", path, token)
            # refused: unknown (404), or not one of the open paths at all (401 without the token)
            assert status in (401, 404), (path, token, status, body[:200])
            assert secret not in body and b"root:" not in body and b"<html" not in body, (path, token)
    # the open paths are GET and HEAD of the files only: another method needs the token as everything else
    assert raw(guarded.url, "POST", "/dashboard")[0] == 401
    assert raw(guarded.url, "POST", "/dashboard", TOKEN)[0] == 405


def test_the_data_calls_need_the_admin_token(guarded: Served) -> None:
    for path in ("/v1/overview", "/v1/overview?since=0", "/v1/events?since=0", "/v1", "/metrics", "/v1/apps"):
        status, headers, body = raw(guarded.url, "GET", path)
        assert status == 401 and headers["www-authenticate"].startswith("Bearer"), path
        assert "error" in json.loads(body)
        assert raw(guarded.url, "GET", path, "wrong")[0] == 401
        assert raw(guarded.url, "GET", path, TOKEN)[0] == 200, path
    status, _, body = raw(guarded.url, "GET", "/v1/overview", TOKEN)
    doc = json.loads(body)
    assert {"nodes", "apps", "last_event", "time_s"} <= set(doc) and [n["name"] for n in doc["nodes"]] == ["n1", "n2"]
    # no CORS: a page of another origin cannot read an answer (the header would need a preflight, never granted)
    status, headers, _ = raw(guarded.url, "OPTIONS", "/v1/overview")
    assert status in (401, 405) and "access-control-allow-origin" not in headers


def test_an_open_control_plane_serves_page_and_data_without_a_token(loop: Loop, tmp_path: Path) -> None:
    s = Served(loop, tmp_path, None)
    try:
        assert raw(s.url, "GET", "/dashboard")[0] == 200
        status, _, body = raw(s.url, "GET", "/v1/overview")
        assert status == 200 and json.loads(body)["apps"] == []
        assert raw(s.url, "GET", "/dashboard/..%2Fdashboard.py")[0] == 404
    finally:
        s.stop()


def test_the_page_fetches_nothing_from_elsewhere_and_has_no_inline_code() -> None:
    assert sorted(p.name for p in FOLDER.iterdir()) == sorted(ASSETS)
    html = (FOLDER / "index.html").read_text(encoding="utf-8")
    # every script and stylesheet is a file of the page: no inline script, handler or style (the CSP refuses them)
    assert re.findall(r"<script\b[^>]*>", html) == ['<script src="/dashboard/dashboard.js" defer>']
    assert not re.search(r"\son[a-z]+=|\sstyle=|<style\b|javascript:", html, re.I)
    for name in ASSETS:
        text = (FOLDER / name).read_text(encoding="utf-8")
        urls = set(re.findall(r"(?:https?:)?//[A-Za-z0-9.-]+\.[a-z]{2,}[^\s\"'`)]*", text))
        assert urls <= {"http://www.w3.org/2000/svg"}, (name, urls)  # the SVG namespace, never fetched
    js = (FOLDER / "dashboard.js").read_text(encoding="utf-8")
    # data is written as text, never parsed as markup; the token travels in a header, never a cookie
    assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(|new Function", js)
    assert "document.cookie" not in js and '"Authorization"' in js and "sessionStorage" in js


def test_the_pages_files_are_package_data() -> None:
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"][
        "package-data"]["edgemux"]
    for p in FOLDER.iterdir():
        rel = p.relative_to(ROOT / "src" / "edgemux").as_posix()
        assert any(fnmatch.fnmatch(rel, pat) for pat in patterns), rel
