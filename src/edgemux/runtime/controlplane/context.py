"""The CLI's context: which control plane it talks to and with which credentials, as ``kubectl``'s kubeconfig.

``edgemux up`` writes the running cluster's context (its control plane's URL, its admin token's file and, with
``--tls``, its CA) to ``~/.edgemux/context.json`` (``$EDGEMUX_CONTEXT`` names another file, and
``$EDGEMUX_HOME`` another folder than ``~/.edgemux``; mode 600), and
removes it when it stops, if the file still names that cluster. A client verb then resolves each setting from,
first to last: its flag (``--server``, ``--token-file``), the environment (``$EDGEMUX_SERVER``,
``$EDGEMUX_TOKEN_FILE``/``$EDGEMUX_TOKEN``, ``$SSL_CERT_FILE``), the context, the default (``http://127.0.0.1:8470``,
no token, the system's CAs). A context file that cannot be read is an ``InputError`` naming it.
"""

from __future__ import annotations

import json
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from edgemux.errors import InputError
from edgemux.runtime.auth import TOKEN_ENV, TOKEN_FILE_ENV, resolve_token
from edgemux.runtime.controlplane.apiclient import DEFAULT_SERVER
from edgemux.runtime.tls import CA_ENV, client_context

__all__ = ["CONTEXT_ENV", "HOME_ENV", "SERVER_ENV", "ClientSettings", "client_settings", "context_path",
           "edgemux_home", "remove_context", "write_context"]

CONTEXT_ENV = "EDGEMUX_CONTEXT"
HOME_ENV = "EDGEMUX_HOME"
SERVER_ENV = "EDGEMUX_SERVER"


def edgemux_home() -> Path:
    """edgemux's own folder: ``$EDGEMUX_HOME``, else ``~/.edgemux`` (the context, ``edgemux up``'s clusters)."""
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".edgemux")


def context_path() -> Path:
    """Where the context lives: ``$EDGEMUX_CONTEXT``, else ``context.json`` in ``edgemux_home()``."""
    return Path(os.environ.get(CONTEXT_ENV) or edgemux_home() / "context.json")


def write_context(server: str, token_file: str | None, ca: str | None) -> Path:
    """Record a running cluster as the CLI's context (mode 600: it names the token's file); returns its path."""
    path = context_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"server": server, "token_file": token_file, "ca": ca}, f)
    tmp.replace(path)
    return path


def remove_context(server: str) -> None:
    """Remove the context if it still names ``server`` (another cluster started since keeps its own)."""
    path = context_path()
    try:
        if json.loads(path.read_text(encoding="utf-8")).get("server") == server:
            path.unlink()
    except (OSError, ValueError, AttributeError):
        pass


def _read_context() -> dict[str, str | None]:
    path = context_path()
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise InputError(CONTEXT_ENV, f"{path}: not a readable context ({e}); remove it or fix it") from None
    if not isinstance(doc, dict) or not all(isinstance(doc.get(k), (str, type(None)))
                                            for k in ("server", "token_file", "ca")):
        raise InputError(CONTEXT_ENV, f"{path}: expected {{\"server\", \"token_file\", \"ca\"}} strings")
    return {k: doc.get(k) for k in ("server", "token_file", "ca")}


@dataclass(frozen=True)
class ClientSettings:
    """What a client verb uses: the control plane's ``server`` URL, the admin ``token`` (None: none) and the
    TLS ``context`` its calls verify with (None: the system's CAs, or ``$SSL_CERT_FILE``)."""

    server: str
    token: str | None
    context: ssl.SSLContext | None


def client_settings(server: str | None, token_file: str | None) -> ClientSettings:
    """Resolve a client verb's settings from its flags, the environment and the context (module doc)."""
    env = os.environ
    ctx = {} if (server or env.get(SERVER_ENV)) and (token_file or env.get(TOKEN_FILE_ENV) or env.get(TOKEN_ENV)) \
        else _read_context()
    url = server or env.get(SERVER_ENV) or ctx.get("server") or DEFAULT_SERVER
    from_context = not (server or env.get(SERVER_ENV)) and ctx.get("server") is not None
    token = resolve_token(token_file)
    if token is None and from_context and ctx.get("token_file"):
        token = resolve_token(ctx["token_file"])
    tls = None
    if from_context and ctx.get("ca") and not env.get(CA_ENV):
        tls = client_context(ctx["ca"])
    return ClientSettings(url.rstrip("/"), token, tls)
