"""Engine adapters: one module per engine; nothing outside this package branches on an engine's name.

``detect(url)`` asks each adapter whether a running server is its own, so verify and bench
work on any OpenAI-compatible endpoint and learn the engine from the server itself.
"""

from __future__ import annotations

import httpx

from .. import net
from ..errors import EngineFailed, NotFound
from . import llamacpp
from .base import Capabilities, LaunchSpec, ServerInfo

ADAPTERS = (llamacpp,)   # probed in order; each returns ServerInfo or None
BY_NAME = {a.ENGINE: a for a in ADAPTERS}
DEFAULT_ENGINE = llamacpp.ENGINE   # the embedded default: runs on a fresh machine with no GPU


def adapter(engine: str):
    try:
        return BY_NAME[engine]
    except KeyError:
        raise NotFound(f"no adapter for engine {engine!r}; known: {', '.join(BY_NAME)}.") from None


def detect(url: str, timeout: float = 5.0) -> ServerInfo:
    """Identify the server at ``url``; a reachable OpenAI server of unknown make is 'unknown'."""
    url = url.rstrip("/")
    for a in ADAPTERS:
        info = a.probe(url, timeout=timeout)
        if info is not None:
            return info
    try:
        resp = net.get(f"{url}/v1/models", timeout=timeout)
    except httpx.HTTPError as exc:
        raise NotFound(f"no server answers at {url} ({type(exc).__name__}).") from None
    try:
        body = resp.json()
        data = body["data"]
        model_id = data[0]["id"] if data else ""
    except (ValueError, KeyError, TypeError, IndexError):
        raise EngineFailed(
            f"{url} answered /v1/models with HTTP {resp.status_code} but not an OpenAI model list; "
            "is this an OpenAI-compatible server?"
        ) from None
    return ServerInfo(url=url, engine="unknown", model_id=model_id)


__all__ = ["ADAPTERS", "DEFAULT_ENGINE", "Capabilities", "LaunchSpec", "ServerInfo", "adapter", "detect"]
