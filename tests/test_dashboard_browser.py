"""The dashboard in a real browser against a real cluster: ``edgemux up`` on examples/local/cluster.yaml (2 s
adaptation windows), ``edgemux apply -f examples/local/apps.yaml``, then headless Chromium (Debian's, driven by
Playwright) opens ``/dashboard#token=...`` and shows every node, device and app with its predicted latency; under
``edgemux load`` each app's observed latency appears; ``edgemux move`` shows up in the events timeline without a
reload; a page without the token sees the sign-in form and no data, and a wrong token is refused.

With ``EDGEMUX_SCREENSHOT=1`` it saves the page to docs/img/dashboard.png (docs/dashboard.md shows it).
Skipped, saying why, where /usr/bin/chromium or Playwright is absent (.ci/run installs Chromium; Playwright is in
the test extra). Playwright never downloads a browser here: it launches /usr/bin/chromium."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from edgemux.runtime.controlplane.dashboard import dashboard_url

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))  # upchild: `edgemux up` as a child, shared with the benchmarks
from upchild import Up  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
# Chromium as the machines here run it: without the background-networking flags it keeps trying to reach
# Google's hosts, which a closed network refuses
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCREENSHOT = ROOT / "docs" / "img" / "dashboard.png"
LOCAL = ROOT / "examples" / "local"
UP_TIMEOUT_S = 150.0   # up measures the cpu profiles first; a loaded 2-core machine takes its time
STEP_S = 30.0          # each wait for the page (a poll is 2 s, a window 2 s)
LOAD_S = 10            # edgemux load per app, all at once

T = TypeVar("T")

try:
    from playwright.sync_api import Page, expect, sync_playwright
except ImportError:  # pragma: no cover - the test extra has it
    sync_playwright = None  # type: ignore[assignment]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason=f"{CHROMIUM} is absent: apt-get install chromium"),
    pytest.mark.skipif(sync_playwright is None, reason="playwright is absent: pip install -e '.[test]'"),
]


def until(what: str, probe: Callable[[], T], timeout_s: float = STEP_S, every_s: float = 0.25) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(every_s)


def edgemux(*args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgemux", *args], capture_output=True, text=True,
                          timeout=timeout_s, cwd=ROOT)


def get_json(url: str, token: str) -> Any:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


class Cluster:
    """``edgemux up`` with its own CLI context: the control plane's URL and admin token, as the CLI finds them."""

    def __init__(self, tmp: Path) -> None:
        self.context = tmp / "context.json"
        self.up = Up(["--cluster", str(LOCAL / "cluster.yaml"), "--adapt-option", "window_s=2"])  # --ephemeral

        def ready() -> dict[str, Any] | None:
            if self.up.proc.poll() is not None:
                raise AssertionError("edgemux up exited:\n" + "\n".join(self.up.lines[-40:]))
            try:
                return json.loads(self.context.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return None

        doc = until("edgemux up to write its CLI context", ready, UP_TIMEOUT_S)
        self.url: str = doc["server"]
        self.token = Path(doc["token_file"]).read_text(encoding="utf-8").strip()

    def overview(self) -> Any:
        return get_json(self.url + "/v1/overview", self.token)


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    # this test's own CLI context and edgemux home: up writes them, apply/load/move read them
    monkeypatch.setenv("EDGEMUX_CONTEXT", str(tmp_path / "context.json"))
    monkeypatch.setenv("EDGEMUX_HOME", str(tmp_path / "home"))
    for name in ("EDGEMUX_SERVER", "EDGEMUX_TOKEN", "EDGEMUX_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        code = c.up.stop()
        assert code == 0, "\n".join(c.up.lines[-40:])


def text(page: Page, selector: str) -> str:
    return page.locator(selector).inner_text()


def attr(page: Page, selector: str, name: str) -> str | None:
    loc = page.locator(selector)
    return loc.first.get_attribute(name) if loc.count() else None


def test_the_dashboard_shows_the_cluster_live(cluster: Cluster) -> None:
    t0 = time.monotonic()
    applied = edgemux("apply", "-f", str(LOCAL / "apps.yaml"))
    assert applied.returncode in (0, 1) and "created" in applied.stdout, applied.stdout + applied.stderr
    ov = cluster.overview()
    apps = {a["name"]: a for a in ov["apps"]}
    devices = {d["path"]: d for n in ov["nodes"] for d in n["devices"]}
    assert len(apps) >= 4 and {"cam-entrance", "classify"} <= set(apps), sorted(apps)
    assert [n["name"] for n in ov["nodes"]] == ["edge-1", "edge-2", "cpu-1"] and len(devices) == 4

    assert sync_playwright is not None
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_context(viewport={"width": 1360, "height": 900}).new_page()
            problems: list[str] = []
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.goto(dashboard_url(cluster.url, cluster.token))
            # (no wait_for_function of a string: the page's CSP forbids eval, as it should)
            expect(page.locator("article[data-app]")).to_have_count(len(apps), timeout=STEP_S * 1000)
            # the token left the address at once, for this tab's session storage
            assert "token" not in page.url and page.url.endswith("/dashboard"), page.url
            assert page.evaluate("sessionStorage.getItem('edgemux.dashboard.token')") == cluster.token
            page.evaluate("window.notReloaded = true")  # gone if the page ever reloads

            # every node, device and app, each app with its predicted latency at its SLO statistic
            for node in ov["nodes"]:
                assert page.locator(f'[data-node="{node["name"]}"]').is_visible(), node["name"]
            for path, d in devices.items():
                row = f'[data-device="{path}"]'
                assert d["kind"] in text(page, row), path
                want = "emulated" if d["emulated"] else "real"
                assert text(page, f"{row} .backend").startswith(want), (path, text(page, f"{row} .backend"))
                assert attr(page, f"{row} .util-pred", "data-value") is not None, path
            for name, a in apps.items():
                card = f'article[data-app="{name}"]'
                pred = a["predicted"]["at_slo_stat_ms"]
                shown = attr(page, f"{card} .latency-pred", "data-ms")
                assert isinstance(pred, float) and shown is not None, (name, pred, shown)
                assert float(shown) == pytest.approx(pred, rel=0.25), (name, shown, pred)
                assert text(page, f"{card} .latency-pred").endswith(" ms")
                assert a["placement"][0]["device"] in text(page, f"{card} .app-placement")
                assert f'{a["slo"]["stat"]} ≤' in text(page, f"{card} .app-slo")
                assert page.locator(f"{card} svg.chart").count() == 1

            # load on every app at once: each one's observed latency shows up (a window closes every 2 s)
            loads = [subprocess.Popen([sys.executable, "-m", "edgemux", "load", "--app", name, "--duration",
                                       str(LOAD_S)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                      cwd=ROOT) for name in apps]
            seen: dict[str, str] = {}
            try:
                def observed_everywhere() -> bool:
                    for name in apps:
                        value = attr(page, f'article[data-app="{name}"] .latency-obs', "data-ms")
                        if value is not None and name not in seen:
                            seen[name] = text(page, f'article[data-app="{name}"] .latency-obs')
                    return len(seen) == len(apps)

                until(f"observed latency of every app (seen: {sorted(seen)})", observed_everywhere, STEP_S)
            finally:
                for p in loads:
                    try:
                        p.wait(LOAD_S + 30)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait(10)
            assert all(v.endswith(" ms") for v in seen.values()), seen
            for name in apps:  # and the chart draws both lines' points
                chart = f'article[data-app="{name}"] svg.chart'
                assert int(attr(page, chart, "data-pred-points") or 0) >= 1, name
                assert int(attr(page, chart, "data-obs-points") or 0) >= 1, name
            busy = [p for p in devices if float(attr(page, f'[data-device="{p}"] .util-obs', "data-value") or 0) > 0]
            assert busy, "no device reported any utilization under load"

            # an operator's move: in the timeline, newest first, without a reload
            where = apps["classify"]["placement"][0]["device"]
            target = "cpu-1/cpu0" if where != "cpu-1/cpu0" else "edge-1/tpu0"
            moved = edgemux("move", "app", "classify", "--to", target)
            assert moved.returncode == 0, moved.stdout + moved.stderr
            entry = page.locator('#events li[data-app="classify"][data-kind="operator-move"]').filter(has_text=target)
            entry.first.wait_for(timeout=STEP_S * 1000)
            assert page.evaluate("window.notReloaded") is True
            assert target in text(page, 'article[data-app="classify"] .app-placement')
            times = page.eval_on_selector_all("#events li time", "ts => ts.map(t => Date.parse(t.dateTime))")
            assert times == sorted(times, reverse=True), times

            if os.environ.get("EDGEMUX_SCREENSHOT") == "1":
                SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(SCREENSHOT), full_page=True)
            assert not problems, problems

            # another browser, without the token: the sign-in form and no data
            other = browser.new_context().new_page()
            other.goto(cluster.url + "/dashboard")
            other.locator("#signin").wait_for(state="visible", timeout=STEP_S * 1000)
            assert other.locator("#data").is_hidden() and other.locator("article[data-app]").count() == 0
            body = other.locator("body").inner_text()
            assert not any(name in body for name in apps), body
            other.fill("#token", "not-the-token")
            other.click("#signin button[type=submit]")
            expect(other.locator("#signin-error")).to_contain_text("refused", timeout=STEP_S * 1000)
            assert other.locator("article[data-app]").count() == 0
            other.fill("#token", cluster.token)  # the form signs in as the fragment does
            other.click("#signin button[type=submit]")
            other.locator('article[data-app="classify"]').wait_for(timeout=STEP_S * 1000)
        finally:
            browser.close()
    print(f"browser test: {time.monotonic() - t0:.1f} s after up was ready")
