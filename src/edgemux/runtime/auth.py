"""Who may call an edgemux service: the cluster's admin token and each app's key.

Two kinds of bearer credential (``Authorization: Bearer <secret>``), both random secrets (256 bits):

- the **admin token**: one per cluster, for every control API (the control plane's ``/v1``, the agents' and
  the gateways' ``/v1`` and their ``/metrics``) and for the calls edgemux's own processes make to one another
  (the control plane driving agents and gateways, agents and gateways registering, gateways sending inference
  to agents). ``edgemux up`` writes one to a file only its owner can read and hands it to the processes it
  starts (``EDGEMUX_TOKEN`` in their environment) and to the CLI (``--token-file`` or ``EDGEMUX_TOKEN_FILE``).
- an **app key**: issued by the control plane when an app is created (shown once, in the apply's answer),
  replaced by ``edgemux rotate-key app NAME`` (the old one stops working at once). It opens that app's
  inference endpoints (``/v2/models/{app}/...``) at the gateways and, unless an agent is started with
  ``--no-app-keys``, at the agents, and nothing else. Services keep only its SHA-256 digest.

A service started without a token is open (every call allowed), as before authentication existed: that is the
mode of the unit tests and of a single-user laptop, never of ``edgemux up``. Health (``/v2/health/...``) and
server metadata (``/v2``) stay open, as a load balancer's probe needs them. **Protected mode** (as Redis's):
a service whose ``--host`` is not a loopback address (:func:`is_loopback`: 127.0.0.0/8, ::1, ``localhost``;
``0.0.0.0`` and ``::`` are every address, so not) refuses to start without a token unless told ``--no-auth``
(:func:`server_token`), so that a service reachable from other hosts is never open by accident.

A missing or malformed credential, or one the service does not know, is 401 with ``WWW-Authenticate:
Bearer``; a valid credential that does not open what it asks for (an app key on a control API or on another
app) is 403. Both answer ``{"error": ...}`` before any handler runs. Comparisons are constant-time.

A gateway marks the inference it forwards as policed and counted there (``POLICED_HEADER``), so that the agent
does neither again; :func:`policed_upstream` believes the mark only beside the admin token (or at an open
service), so a client holding an app key cannot use it to skip the agent's policing.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
import stat
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgemux.errors import EdgemuxError, InputError

if TYPE_CHECKING:  # the clients (CLI, engine) use this module without the serving stack
    from edgemux.runtime.httpserver import Request, Response

__all__ = ["ADMIN", "ANYONE", "KEY_PREFIX", "OPEN", "POLICED_HEADER", "TOKEN_ENV", "TOKEN_FILE_ENV",
           "AuthError", "Guard", "Need", "auth_headers", "auth_middleware", "bearer", "digest", "inference_need",
           "is_digest", "is_loopback", "mark_believed", "new_app_key", "new_token", "policed_upstream",
           "read_token_file", "resolve_token", "server_token", "write_token_file"]

TOKEN_ENV = "EDGEMUX_TOKEN"            # the admin token itself: how an engine hands it to the processes it starts
TOKEN_FILE_ENV = "EDGEMUX_TOKEN_FILE"  # a file holding it: how a user hands it to the CLI
KEY_PREFIX = "emk_"                    # an app key, so that a leaked one is recognizable (as GitHub's ghp_)
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="edgemux"'}
# The mark a gateway puts on the inference it forwards: "policed and counted at a gateway". An agent believes
# it only from a caller holding the admin token (policed_upstream), so an app key cannot skip the agent's
# policing; a service without a token is open and believes every caller, as it lets every caller do anything.
POLICED_HEADER = "Edgemux-Policed"


class AuthError(EdgemuxError):
    """A request without the credential it needs: ``status`` 401 (none, malformed or unknown) or 403 (valid,
    but not for this)."""

    def __init__(self, message: str, status: int = 401) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def new_token() -> str:
    """A fresh admin token (URL-safe text, 256 random bits)."""
    return secrets.token_urlsafe(32)


def new_app_key() -> str:
    """A fresh app key (``emk_`` and 256 random bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def digest(secret: str) -> str:
    """The SHA-256 hex digest services keep of an app key (never the key itself)."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def is_digest(value: object) -> bool:
    """Whether ``value`` is a key digest as services keep one: 64 lowercase hex digits (SHA-256)."""
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def write_token_file(path: str | os.PathLike[str]) -> str:
    """Write a new admin token to ``path``, readable and writable by its owner only (mode 0600, set as it is
    created: never readable by others, even for an instant); returns the token. An existing file is
    replaced."""
    from edgemux.runtime.tls import write_private

    token = new_token()
    write_private(path, (token + "\n").encode("utf-8"))
    return token


def read_token_file(path: str | os.PathLike[str], field: str = "--token-file") -> str:
    """The admin token in ``path``; ``InputError`` naming ``field`` for a file that is missing, empty, or
    readable or writable by anyone but its owner (as ssh refuses such a key: a token others can read is
    everyone's)."""
    p = Path(path)
    try:
        mode = p.stat().st_mode
        text = p.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise InputError(field, f"{p}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(field, f"{p}: cannot read it ({e})") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InputError(field, f"{p}: others can access it (mode {stat.S_IMODE(mode):04o}); a token file must be "
                         f"for its owner only: chmod 600 {p}")
    if not text or any(c.isspace() for c in text):
        raise InputError(field, f"{p}: expected one token on one line")
    return text


def resolve_token(token_file: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """The admin token a process uses: ``token_file`` (``--token-file``), else the file ``EDGEMUX_TOKEN_FILE``
    names, else ``EDGEMUX_TOKEN`` itself; None when none is given (an open service, a client without one)."""
    env = os.environ if env is None else env
    if token_file:
        return read_token_file(token_file)
    if env.get(TOKEN_FILE_ENV):
        return read_token_file(env[TOKEN_FILE_ENV], TOKEN_FILE_ENV)
    token = env.get(TOKEN_ENV, "").strip()
    return token or None


def is_loopback(host: str) -> bool:
    """Whether a listener on ``host`` (a ``--host`` value) is reachable from this host only: ``localhost``, an
    address in 127.0.0.0/8 or ``::1`` (bracketed or not, and IPv4-mapped). Every other value is reachable
    from other hosts: ``0.0.0.0`` and ``::`` (every interface), ``""`` (every interface to asyncio), another
    address, and any other host name (what it resolves to may change; give the address to mean loopback)."""
    h = host.strip().strip("[]").rstrip(".").lower()
    if h == "localhost":
        return True
    try:
        addr = ipaddress.ip_address(h.partition("%")[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def server_token(token_file: str | None, no_auth: bool, host: str, env: Mapping[str, str] | None = None) -> str | None:
    """The admin token of a service listening on ``host`` (``edgemux agent``, ``gateway``, ``controlplane``):
    :func:`resolve_token`'s (``--token-file``, ``$EDGEMUX_TOKEN_FILE``, ``$EDGEMUX_TOKEN``); None to run open.

    Protected mode: without a token, a service on a non-loopback ``host`` (:func:`is_loopback`) refuses to
    start (``InputError`` on ``--host``, naming the fix) unless ``no_auth`` (``--no-auth``) says so. With
    ``no_auth`` the service is open whatever the environment holds (a token in ``$EDGEMUX_TOKEN`` is
    ignored); together with ``--token-file`` it is a contradiction (``InputError`` on ``--no-auth``)."""
    if no_auth:
        if token_file:
            raise InputError("--no-auth", "given with --token-file: run open (--no-auth) or with that token, "
                             "not both")
        return None
    token = resolve_token(token_file, env)
    if token is None and not is_loopback(host):
        raise InputError("--host", f"{host or '(every address)'} is reachable from other hosts and no admin token "
                         "is given; give one (--token-file FILE or $EDGEMUX_TOKEN_FILE) or run open with --no-auth")
    return token


def auth_headers(secret: str | None) -> dict[str, str]:
    """The ``Authorization`` header carrying ``secret`` (none without one)."""
    return {"Authorization": f"Bearer {secret}"} if secret else {}


def bearer(header: str | None) -> str | None:
    """The secret of an ``Authorization: Bearer <secret>`` header; None without a header; ``AuthError`` 401
    for another scheme or an empty secret."""
    if header is None:
        return None
    scheme, _, secret = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise AuthError("the Authorization header must be 'Bearer <token>'")
    return secret.strip()


@dataclass(frozen=True)
class Need:
    """What a request needs: ``admin`` (the admin token), ``app`` (that app's key or the admin token),
    ``anyone`` (a valid credential: the admin token or any app's key, e.g. for the shared-memory regions a
    credential owns), or none of them (open)."""

    admin: bool = False
    app: str | None = None
    anyone: bool = False


OPEN = Need()
ADMIN = Need(admin=True)
ANYONE = Need(anyone=True)


class Guard:
    """The server side of authentication (pure: no I/O). ``token``: the cluster's admin token (None: the
    service is open). ``key_of``: an app's key digest (None: the app has none, or is unknown); ``owner_of``:
    the app a key digest belongs to (None: no app's), so that a key used on another app is a 403, not a 401;
    ``app_keys``: whether app keys are accepted at all (an agent with ``--no-app-keys``: only the admin token)."""

    def __init__(self, token: str | None, key_of: Callable[[str], str | None] = lambda app: None,
                 owner_of: Callable[[str], str | None] = lambda d: None, *, app_keys: bool = True) -> None:
        if token is not None and (not token or any(c.isspace() for c in token)):
            raise InputError("token", "an admin token is one non-empty word")
        self.token = token
        self.key_of = key_of
        self.owner_of = owner_of
        self.app_keys = app_keys

    @property
    def enabled(self) -> bool:
        return self.token is not None

    def check(self, need: Need, header: str | None) -> None:
        """Allow the request (return) or refuse it (``AuthError``): see the module docstring."""
        if self.token is None or not (need.admin or need.app is not None or need.anyone):
            return
        secret = bearer(header)
        if secret is None:
            raise AuthError("missing credentials: send 'Authorization: Bearer <token>'" + (
                " (the cluster's admin token)" if need.admin else " (an app's key or the admin token)"
                if need.app is None else f" (app {need.app}'s key or the admin token)"))
        if hmac.compare_digest(secret.encode("utf-8"), self.token.encode("utf-8")):
            return
        d = digest(secret)
        owner = self.owner_of(d)
        if need.anyone:
            if owner is None or not self.app_keys:
                raise AuthError("invalid token" if owner is None else
                                "this service takes only the cluster's admin token, not app keys", 401 if owner
                                is None else 403)
            return
        if need.admin:
            if owner is not None:
                raise AuthError("an app key opens only its app's inference endpoints, not this API: use the "
                                "cluster's admin token", 403)
            raise AuthError("invalid token")
        assert need.app is not None
        want = self.key_of(need.app)
        if self.app_keys and want is not None and hmac.compare_digest(d, want):
            return
        if owner is not None:
            if not self.app_keys:
                raise AuthError("this service takes inference only with the cluster's admin token (from a gateway),"
                                " not with app keys", 403)
            raise AuthError(f"this key is not app {need.app}'s", 403)
        raise AuthError("invalid token")

    def is_admin(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header carries the admin token (constant time; False for an open
        service, which has none, and for a malformed header)."""
        if self.token is None:
            return False
        try:
            secret = bearer(header)
        except AuthError:
            return False
        return secret is not None and hmac.compare_digest(secret.encode("utf-8"), self.token.encode("utf-8"))


Handler = Callable[["Request"], Awaitable["Response"]]


def auth_middleware(guard: Guard, need_of: Callable[[Request], Need],
                    prepare: Callable[[Need], Awaitable[None]] | None = None) -> Any:
    """A middleware (``runtime.httpserver``) that runs ``guard.check`` with ``need_of(request)`` before the
    handler: a refusal is a JSON ``{"error": ...}`` with 401 (and ``WWW-Authenticate: Bearer``) or 403, and
    the handler never runs. ``prepare`` is awaited first (a gateway looks an app's route up, so that its key is
    known). None for an open service (``guard`` without a token, which never gets one later): no middleware,
    nothing to check."""
    from edgemux.runtime.httputil import error_response

    if not guard.enabled:
        return None

    async def middleware(request: Request, handler: Handler) -> Response:
        try:
            need = need_of(request)
            if prepare is not None:
                await prepare(need)
            guard.check(need, request.headers.get("Authorization"))
        except AuthError as e:
            return error_response(e.status, e.message, _CHALLENGE if e.status == 401 else None)
        return await handler(request)

    return middleware


def inference_need(request: Request, app_param: str = "app") -> Need:
    """The need of a request to a service that serves inference (agent, gateway): an app's
    ``/v2/models/{app}...`` its key (or the admin token); health and server metadata nothing; everything else,
    ``/v1/...``, ``/metrics`` and a path no route matches, the admin token (an unknown path is not an open
    door)."""
    path = request.path
    if path.startswith("/v2/models/"):
        name = request.match_info.get(app_param)
        return Need(app=name) if name else ADMIN
    if path in ("/v2", "/v2/") or path.startswith("/v2/health/"):
        return OPEN
    if path.startswith("/v2/systemsharedmemory/"):
        return ANYONE  # each credential sees and uses only the regions it registered (dataplane.shm)
    return ADMIN


def policed_upstream(request: Request, guard: Guard) -> bool:
    """Whether ``request`` carries a gateway's mark (``POLICED_HEADER``: policed against the app's contract
    and counted there already) that may be believed: it came with the admin token, which edgemux's gateways
    send and clients do not hold, or to an open service (``guard`` without a token), which believes every
    caller. A client's app key never makes the mark count."""
    return mark_believed(POLICED_HEADER in request.headers, request.headers.get("Authorization"), guard)


def mark_believed(marked: bool, authorization: str | None, guard: Guard) -> bool:
    """Whether a gateway's mark (``marked``: the request carries it, as the HTTP header or gRPC metadata
    ``edgemux-policed``) may be believed beside the credential ``authorization`` (see :func:`policed_upstream`)."""
    return marked and (not guard.enabled or guard.is_admin(authorization))
