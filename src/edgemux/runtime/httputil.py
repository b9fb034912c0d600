"""What the runtime's HTTP servers (agent, control plane, gateway) share when reading a request: the body
with a size limit, and JSON parsed into a clear 4xx instead of an exception.

Each server raises its own error type (``status`` and message); the helpers take it as ``error``, a
callable ``(message, status) -> Exception``. Units: bytes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

__all__ = ["read_body", "parse_json"]

ErrorFactory = Callable[[str, int], Exception]


async def read_body(request: web.Request, limit: int, error: ErrorFactory) -> bytes:
    """The request body, refusing (413) one above ``limit`` bytes: from Content-Length before reading
    anything, and while reading when the length is not declared (chunked)."""
    length = request.content_length
    if length is not None and length > limit:
        raise error(f"request body of {length} bytes exceeds the limit of {limit} bytes", 413)
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await request.content.readany()
        if not chunk:
            break
        size += len(chunk)
        if size > limit:
            raise error(f"request body exceeds the limit of {limit} bytes", 413)
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json(raw: bytes, what: str, error: ErrorFactory) -> Any:
    """Parse JSON bytes; every failure is ``error(message, 400)`` saying where it went wrong."""
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise error(f"malformed {what} JSON: invalid UTF-8 at byte {e.start}", 400) from None
    except json.JSONDecodeError as e:
        raise error(f"malformed {what} JSON at line {e.lineno} column {e.colno}: {e.msg}", 400) from None
    except RecursionError:
        raise error(f"malformed {what} JSON: nested too deeply", 400) from None
    except ValueError as e:  # e.g. an integer literal longer than Python's int-conversion limit
        raise error(f"malformed {what} JSON: {e}", 400) from None
