"""The control plane's read-only dashboard (docs/dashboard.md): a page of static files (``dashboard/``: HTML, plain
JavaScript, CSS; no build step, nothing fetched from elsewhere) served at ``GET /dashboard`` and
``GET /dashboard/{asset}``, whose script polls ``GET /v1/overview`` and ``GET /v1/events?since=`` every 2 s.

Security model:

- the **shell** (the files here) carries no data, so it is served without a credential (:func:`need`): a
  visitor without the token gets a page that can show nothing but its sign-in form;
- every **data call** is the script's ``fetch`` to ``/v1/...`` with ``Authorization: Bearer <token>``, a header
  and never a cookie: a page of another site can neither read the token (sessionStorage is per origin) nor make
  the browser attach it, and a cross-origin request carrying that header needs a CORS preflight that the control
  plane never grants. Every ``/v1`` route and ``/metrics`` keep needing the admin token;
- the token reaches the page in the URL's fragment (``/dashboard#token=...``: :func:`dashboard_url`), which a
  browser never sends to a server; the script moves it to sessionStorage and clears the fragment, or takes it
  from a sign-in form. An open control plane (no token) answers the calls without one, and the page just works;
- the answers carry ``Content-Security-Policy: default-src 'self'; frame-ancestors 'none'`` (no inline script,
  nothing from another origin, never in a frame), ``X-Content-Type-Options: nosniff`` and ``Referrer-Policy:
  no-referrer``; the script writes data into the page as text only (never as markup).
"""

from __future__ import annotations

import re
import urllib.parse
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING

from edgemux.runtime.auth import ADMIN, OPEN, Need

if TYPE_CHECKING:
    from edgemux.runtime.httpserver import Request, Response, Route

__all__ = ["ASSETS", "PATH", "SECURITY_HEADERS", "asset", "dashboard_url", "need", "routes"]

PATH = "/dashboard"
# The files of the page (dashboard/), by name, with their content types: nothing else is ever served.
ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # revalidated: a new edgemux's page is seen at once
}
# The raw paths that need no credential: the page and its files by name (one segment of safe characters), as
# sent, before any decoding; every other path (``/v1/...``, ``/metrics``, an unknown one) needs the admin token.
_OPEN_PATH = re.compile(r"^/dashboard(?:/|/[A-Za-z0-9][A-Za-z0-9_-]*(?:\.[A-Za-z0-9]+)?)?$")


def dashboard_url(server_url: str, token: str | None) -> str:
    """The dashboard's address at the control plane ``server_url`` (``http(s)://HOST:PORT``), with the admin
    ``token`` in the fragment (``#token=...``: the browser keeps it, never sends it; the page moves it to its
    session storage); without a token (an open cluster) the plain address."""
    url = server_url.rstrip("/") + PATH
    return f"{url}#token={urllib.parse.quote(token, safe='')}" if token else url


def need(request: Request) -> Need:
    """What a control-plane request needs (``runtime.auth``): nothing for the dashboard's static files, the
    admin token for everything else."""
    return OPEN if request.method in ("GET", "HEAD") and _OPEN_PATH.match(request.raw_path) else ADMIN


@cache
def _read(name: str) -> bytes:
    return resources.files("edgemux.runtime.controlplane").joinpath("dashboard", name).read_bytes()


def asset(name: str) -> tuple[bytes, str] | None:
    """The file ``name`` of the page and its content type; None for a name that is not one of ``ASSETS``
    (a path, ``..``, anything else: the name is looked up, never joined to a path)."""
    kind = ASSETS.get(name)
    return None if kind is None else (_read(name), kind)


async def shell(request: Request) -> Response:
    """``GET /dashboard``: the page."""
    return _answer("index.html")


async def serve_asset(request: Request) -> Response:
    """``GET /dashboard/{asset}``: one of the page's files; 404 for any other name."""
    return _answer(request.match_info["asset"])


def _answer(name: str) -> Response:
    from edgemux.runtime.httpserver import HTTPError, Response

    found = asset(name)
    if found is None:
        raise HTTPError(404, f"no such dashboard file: {name[:80]}")
    body, kind = found
    return Response(body, headers={**SECURITY_HEADERS, "Content-Type": kind})


def routes() -> list[Route]:
    """The dashboard's rows of the control plane's route table."""
    from edgemux.runtime.httpserver import get

    return [get(PATH, shell), get(PATH + "/", shell), get(PATH + "/{asset}", serve_asset)]
