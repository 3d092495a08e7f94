"""What the relay client (``http1.py``) writes: a request's head, its request line and
Host header built once per engine, method and path, then its header lines; URLs parsed
once. Both caches stop growing at ``CACHE_LIMIT`` (then heads and URLs are built each
time), so hosts that come and go cannot grow them without bound.

May touch: nothing but the standard library. Must not touch: I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from fleetgate.backends.relay import UpstreamError

Key = tuple[str, str, int]  # scheme, host, port: one engine, one pool of connections
CACHE_LIMIT = 4096  # parsed URLs, and request heads, kept
_PARSED: dict[str, tuple[Key, str]] = {}
_HEADS: dict[tuple[Key, str, str], bytes] = {}


def parse(url: str) -> tuple[Key, str]:
    """(the engine, the path and query) of ``url``; a ``connect`` failure if not http(s)."""
    found = _PARSED.get(url)
    if found is None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UpstreamError("connect", f"not an http(s) URL: {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        found = (parts.scheme, parts.hostname, port), path
        if len(_PARSED) < CACHE_LIMIT:
            _PARSED[url] = found
    return found


def head(key: Key, method: str, path: str) -> bytes:
    """The request line and Host header (and ``accept-encoding: identity``)."""
    found = _HEADS.get((key, method, path))
    if found is None:
        scheme, host, port = key
        default = 443 if scheme == "https" else 80
        authority = host if port == default else f"{host}:{port}"
        if ":" in host and not host.startswith("["):
            authority = f"[{host}]" if port == default else f"[{host}]:{port}"
        found = (f"{method} {path} HTTP/1.1\r\nhost: {authority}\r\n"
                 "accept-encoding: identity\r\n").encode("latin-1")
        if len(_HEADS) < CACHE_LIMIT:
            _HEADS[(key, method, path)] = found
    return found


def lines(headers: Mapping[str, str] | None) -> bytes:
    """A GET's header lines and the blank line that ends its head."""
    text = "".join(f"{name}: {value}\r\n" for name, value in headers.items()) \
        if headers else ""
    return f"{text}\r\n".encode("latin-1")


def header_lines(headers: Mapping[str, str], length: int) -> bytes:
    """A POST's header lines, its content length and the blank line."""
    text = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    return f"{text}content-length: {length}\r\n\r\n".encode("latin-1")
