"""Target URL checks: load tests only ever send traffic to this machine (loopback)."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


class NotLoopback(ValueError):
    """The target URL's host is not a loopback address."""


def require_loopback(url: str) -> str:
    """Return ``url`` without a trailing slash if its host is loopback, else raise :class:`NotLoopback`.

    Loopback means ``localhost``, any address in 127.0.0.0/8, or ``::1``. Host names other than
    ``localhost`` are refused without a DNS lookup (a name could resolve anywhere).
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise NotLoopback(f"target {url!r} must be an http(s) URL")
    host = parts.hostname
    if host is None:
        raise NotLoopback(f"target {url!r} has no host")
    if host.lower() != "localhost":
        try:
            ok = ipaddress.ip_address(host).is_loopback
        except ValueError:
            ok = False
        if not ok:
            raise NotLoopback(
                f"target {url!r}: host {host!r} is not loopback (127.0.0.0/8, localhost, ::1); "
                "load tests only run against this machine")
    return url.rstrip("/")
