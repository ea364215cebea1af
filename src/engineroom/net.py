"""Every HTTP client engineroom opens comes from here, so proxy handling is decided once.

A request to this machine (127.0.0.0/8, ``localhost``, ``::1``, ``0.0.0.0``) never goes
through a proxy: with ``HTTP_PROXY`` / ``HTTPS_PROXY`` / ``ALL_PROXY`` set (common on
corporate machines) and no ``NO_PROXY`` entry for loopback, httpx would send a health probe
for 127.0.0.1 to the proxy, which cannot reach this machine's loopback; ``up`` then waited
out its timeout on a healthy server. A server elsewhere (``--url http://gpu-box:8000``)
still honours the user's proxy settings (``HTTP(S)_PROXY``, ``ALL_PROXY``, ``NO_PROXY``).
"""

from __future__ import annotations

import ipaddress
from typing import Any

import httpx

__all__ = ["client", "get", "is_loopback"]


def is_loopback(url: str | httpx.URL) -> bool:
    """True when ``url`` names this machine: 127.0.0.0/8, ::1, 0.0.0.0, localhost(.)."""
    try:
        host = httpx.URL(str(url)).host
    except (httpx.InvalidURL, TypeError, ValueError):
        return False
    host = host.strip("[]").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:   # ::ffff:127.0.0.1
        address = address.ipv4_mapped
    return address.is_loopback or address.is_unspecified


def client(url: str, **kwargs: Any) -> httpx.Client:
    """An ``httpx.Client`` for requests to ``url``'s host (pass ``base_url`` etc. as usual).

    Loopback: proxies (and every other environment setting) ignored. Elsewhere: httpx's
    defaults, which honour the proxy environment variables.
    """
    kwargs.setdefault("trust_env", not is_loopback(url))
    return httpx.Client(**kwargs)


def get(url: str, *, timeout: float, **kwargs: Any) -> httpx.Response:
    """One GET with the same proxy rule as ``client``."""
    with client(url, timeout=timeout) as http:
        return http.get(url, **kwargs)
