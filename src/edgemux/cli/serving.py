"""What the long-running commands (``agent``, ``controlplane``, ``gateway``) share: stop on SIGINT/SIGTERM,
and an address that cannot be bound reported as one line (exit code 2), never a traceback."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable
from typing import TypeVar

from edgemux.errors import InputError

T = TypeVar("T")


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM (call from the running event loop): the command then stops
    gracefully, letting in-flight requests finish."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def listen(start: Awaitable[T], host: str, port: int) -> T:
    """``await start`` (a server binding ``host``:``port``), an address that cannot be bound becoming an
    ``InputError`` on ``--port``."""
    try:
        return await start
    except OSError as e:
        raise InputError("--port", f"cannot listen on {host}:{port}: {e.strerror or e}") from None
