"""What every check of the full / stress / soak suites is handed: a recording client and the dialect.

- ``RecordingClient`` is an ``OpenAIClient`` that keeps every request it sent and a compact copy
  of every answer, so each stored check record holds the exchange behind its verdict (long
  strings are cut to a head and their length + sha256, so a 100,000-character tool return does
  not bloat the store).
- ``Dialect`` is what the suites need to know about the server's way of speaking, read from the
  ``ServerInfo`` its adapter filled (never from an adapter module): the thinking switch (the
  caller's, else found in the chat template the server serves, else probed), whether the model
  reasons at all, and whether a chat template engineroom ships forced the tool-call format.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from engineroom.client import ChatResult, OpenAIClient, StreamResult
from engineroom.engines.base import ServerInfo

# Strings longer than this are stored as their head plus length and hash.
KEEP_CHARS = 2000

# Markers a chat template uses for its thinking switch, with the request body that turns thinking
# off / on. Engines silently ignore unknown template kwargs, so the right key must be found.
THINKING_SWITCHES: tuple[tuple[str, dict[str, Any], dict[str, Any]], ...] = (
    ("enable_thinking", {"chat_template_kwargs": {"enable_thinking": False}},
     {"chat_template_kwargs": {"enable_thinking": True}}),
    ("reasoning_effort", {"chat_template_kwargs": {"reasoning_effort": "low"}, "reasoning_effort": "low"},
     {"chat_template_kwargs": {"reasoning_effort": "high"}, "reasoning_effort": "high"}),
    ("thinking", {"chat_template_kwargs": {"thinking": False}}, {"chat_template_kwargs": {"thinking": True}}),
)
# Text in a chat template that shows the model reasons in a block of its own.
REASONING_MARKERS = ("<think>", "</think>", "<|channel|>", "[THINK]", "<|begin_of_thought|>", "<seed:think>")


def compact(value: Any, keep: int = KEEP_CHARS) -> Any:
    """``value`` with every long string cut to ``keep`` chars plus its length and sha256."""
    if isinstance(value, str):
        if len(value) <= keep:
            return value
        digest = hashlib.sha256(value.encode("utf-8", "replace")).hexdigest()[:16]
        return f"{value[:keep]}...[{len(value):,} chars, sha256 {digest}]"
    if isinstance(value, dict):
        return {str(k): compact(v, keep) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [compact(v, keep) for v in value]
    return value


def _calls(result: ChatResult | StreamResult) -> list[dict[str, Any]]:
    return [{"id": c.id, "name": c.name, "arguments": c.arguments, "index": c.index} for c in result.tool_calls]


class RecordingClient(OpenAIClient):
    """An ``OpenAIClient`` that logs each exchange (request sent, answer kept) in ``exchanges``."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 60):
        super().__init__(base_url, api_key=api_key, timeout=timeout)
        self.exchanges: list[dict[str, Any]] = []

    def __enter__(self) -> RecordingClient:
        return self

    def take(self) -> list[dict[str, Any]]:
        """The exchanges since the last call (and forget them)."""
        taken, self.exchanges = self.exchanges, []
        return taken

    def get_json(self, path: str, timeout: float | None = None) -> Any:
        entry: dict[str, Any] = {"endpoint": f"GET {path}", "request": None, "response": None}
        self.exchanges.append(entry)
        try:
            data = super().get_json(path, timeout=timeout)
        except Exception as exc:
            entry["response"] = {"error": str(exc)}
            raise
        entry["response"] = compact({"status": 200, "body": data})
        return data

    def chat(self, payload: dict[str, Any], timeout: float | None = None) -> ChatResult:
        r = super().chat(payload, timeout=timeout)
        response: dict[str, Any] = {"status": r.status, "seconds": round(r.seconds, 4), "error": r.error,
                                    "body": r.raw}
        self.exchanges.append(compact({"endpoint": "POST /v1/chat/completions", "request": copy.deepcopy(payload),
                                       "response": response}))
        return r

    def stream_chat(self, payload: dict[str, Any], timeout: float | None = None,
                    stall_s: float | None = None) -> StreamResult:
        r = super().stream_chat(payload, timeout=timeout, stall_s=stall_s)
        response = {"status": r.status, "seconds": round(r.seconds, 4), "error": r.error, "chunks": r.chunks,
                    "done": r.done, "content": r.content, "reasoning": r.reasoning, "tool_calls": _calls(r),
                    "finish_reason": r.finish_reason, "usage": r.usage, "timings": r.timings,
                    "ttft_s": None if r.ttft is None else round(r.ttft, 4)}
        self.exchanges.append(compact({"endpoint": "POST /v1/chat/completions (stream)",
                                       "request": copy.deepcopy(payload), "response": response}))
        return r

    def post_json(self, path: str, body: dict[str, Any], timeout: float | None = None) -> tuple[int | None, Any, str]:
        """POST ``body`` to ``path``: (status, decoded JSON or None, error text or "")."""
        import time

        import httpx

        t0 = time.perf_counter()
        status: int | None = None
        data: Any = None
        error = ""
        try:
            response = self._http.post(path, json=body, timeout=self._timeout(timeout))
            status = response.status_code
            try:
                data = response.json()
            except ValueError:
                error = "the answer is not JSON"
        except httpx.TimeoutException:
            error = f"no answer within {self._timeout(timeout).read:g} s"
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"
        self.exchanges.append(compact({"endpoint": f"POST {path}", "request": copy.deepcopy(body),
                                       "response": {"status": status, "body": data, "error": error or None,
                                                    "seconds": round(time.perf_counter() - t0, 4)}}))
        return status, data, error


@dataclass(frozen=True)
class Dialect:
    """How this server is spoken to, and where each piece was learnt (``sources``)."""

    thinking_off: dict[str, Any] = field(default_factory=dict)   # merged into answer-style requests
    thinking_on: dict[str, Any] = field(default_factory=dict)
    switch: str = ""                  # the template kwarg found ("enable_thinking"), "" if none
    reasons: bool | None = None       # the model reasons in a block of its own (None: unknown)
    forced_tools: str = ""            # why tool-call PASSes may be the template's doing, not the model's
    sources: dict[str, str] = field(default_factory=dict)
    forced_reasoning: str = ""        # why a reasoning PASS may be the template's doing, not the model's

    def as_dict(self) -> dict[str, Any]:
        return {"thinking_off": self.thinking_off, "thinking_on": self.thinking_on, "switch": self.switch,
                "reasons": self.reasons, "forced_tools": self.forced_tools, "forced_reasoning": self.forced_reasoning,
                "sources": self.sources}


def shipped_template(chat_template: str | None) -> str | None:
    """The name of the engineroom-shipped chat template the server serves, if it is one."""
    if not chat_template:
        return None
    from engineroom.templates import TEMPLATES_DIR

    served = chat_template.strip()
    for path in sorted(TEMPLATES_DIR.glob("*.jinja")):
        text = path.read_text().strip()
        if served == text or (len(served) > 200 and (served in text or text in served)):
            return path.name
    return None


def read_dialect(info: ServerInfo) -> Dialect:
    """The dialect from what the server declared; no request is sent (``probe_dialect`` does that)."""
    sources: dict[str, str] = {}
    template = info.chat_template or ""
    caller = info.extra.get("thinking_off") if info.extra else None
    off: dict[str, Any] = dict(caller) if isinstance(caller, dict) else {}
    on: dict[str, Any] = {}
    switch = ""
    if off:
        sources["thinking_off"] = "given by the caller (ServerInfo.extra)"
    for key, key_off, key_on in THINKING_SWITCHES:
        if key in template:
            switch = key
            on = copy.deepcopy(key_on)
            if not off:
                off = copy.deepcopy(key_off)
                sources["thinking_off"] = f"the served chat template reads {key!r}"
            break
    reasons: bool | None = info.capabilities.reasoning
    if reasons is not None:
        sources["reasons"] = info.capabilities.reasons.get("reasoning") or "the server's declared capabilities"
    elif template:
        marker = next((m for m in REASONING_MARKERS if m in template), None)
        reasons = bool(marker or switch)
        sources["reasons"] = (f"the served chat template contains {marker or switch!r}" if reasons
                              else "the served chat template has no thinking block nor switch")
    forced = forced_reasoning = ""
    name = shipped_template(info.chat_template)
    if name and "<tool_call>" in template:
        forced = (f"the served chat template is engineroom's own {name}, written to make a small model emit "
                  "the tool-call format; tool-call PASSes show the server's tool-call parsing, not the model's skill")
        sources["forced_tools"] = "the chat template the server serves equals a template engineroom ships"
    if name and "<think>" in template:
        forced_reasoning = (f"the served chat template is engineroom's own {name}, which opens the <think> block "
                            "itself; a reasoning PASS shows the server's reasoning parsing, not that the model reasons")
        sources["forced_reasoning"] = "the chat template the server serves equals a template engineroom ships"
    return Dialect(thinking_off=off, thinking_on=on, switch=switch, reasons=reasons, forced_tools=forced,
                   sources=sources, forced_reasoning=forced_reasoning)


def probe_dialect(client: OpenAIClient, info: ServerInfo, dialect: Dialect, timeout: float) -> Dialect:
    """When the server serves no chat template to read, find the thinking switch by trying it.

    "Say OK." (24 tokens) plain: reasoning back and no content means the model thinks by default;
    then each candidate switch is tried and the one that gives a non-empty answer is kept.
    """
    if info.chat_template or dialect.thinking_off:
        return dialect
    base = {**({"model": info.model_id} if info.model_id else {}),
            "messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 24, "temperature": 0.0}
    plain = client.chat(base, timeout=timeout)
    if not plain.ok:
        return dialect
    if not plain.reasoning:
        return replace(dialect, reasons=dialect.reasons if dialect.reasons is not None else None,
                       sources={**dialect.sources, "probe": "a plain 'Say OK.' came back without reasoning"})
    for key, key_off, key_on in THINKING_SWITCHES:
        r = client.chat({**base, **key_off}, timeout=timeout)
        if r.ok and r.content.strip() and not r.reasoning:
            return replace(dialect, thinking_off=copy.deepcopy(key_off), thinking_on=copy.deepcopy(key_on),
                           switch=key, reasons=True,
                           sources={**dialect.sources, "thinking_off": f"probed: {key!r} switched reasoning off"})
    return replace(dialect, reasons=True,
                   sources={**dialect.sources, "thinking_off": "probed: no candidate switch turned reasoning off"})


@dataclass
class Ctx:
    """One suite run's shared state, handed to every check."""

    client: RecordingClient
    info: ServerInfo
    dialect: Dialect
    timeout_scale: float = 1.0
    fast: bool = False
    # the engine's own helpers, handed in by the caller (checks never import an adapter):
    count_tokens: Callable[[str], int | None] | None = None    # the engine's tokenizer, None: it has none
    metrics: Callable[[], dict[str, float] | None] | None = None  # neutral counter names -> values

    def timeout(self, seconds: float) -> float:
        return seconds * self.timeout_scale

    @property
    def model(self) -> dict[str, Any]:
        return {"model": self.info.model_id} if self.info.model_id else {}

    def answer_info(self) -> ServerInfo:
        """The ServerInfo smoke checks get: thinking off merged in as ``extra["thinking_off"]``."""
        if not self.dialect.thinking_off:
            return self.info
        return replace(self.info, extra={**(self.info.extra or {}), "thinking_off": self.dialect.thinking_off})


def pretty(value: Any, limit: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    flat = " ".join(text.split())
    return repr(flat[:limit] + ("..." if len(flat) > limit else ""))
