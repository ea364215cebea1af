"""A small OpenAI-compatible client that times everything on its own clock.

Why its own client rather than the ``openai`` package: verify and bench need the
arrival time of every streamed chunk, the exact moment the first token arrived, and
every failure (broken stream, HTTP error, a chunk that is not JSON) *recorded* in the
result instead of raised, so a check can say precisely what went wrong and a bench can
store the raw record. All times are ``time.perf_counter()`` seconds taken by this
process; engine-reported figures (``usage``, the engine's own timings block) are kept
separately, as the engine sent them, so the two can be cross-checked.

The client is engine-agnostic on purpose: it never looks at which engine answers and
knows no engine's field names. Every top-level field of an answer outside OpenAI's
chat-completion object is kept, as sent, in ``engine_fields``; ``timings`` is the block
among them that an adapter declares as its per-response timings (its ``TIMINGS_FIELD``,
read by its ``normalise_timings``), found through ``engines.timings_block``.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from engineroom import engines, net
from engineroom.errors import EngineFailed, NotFound

__all__ = ["OPENAI_FIELDS", "OpenAIClient", "ChatResult", "StreamResult", "ToolCall"]

# OpenAI's chat-completion (and chunk) object: every other top-level field is the engine's own
OPENAI_FIELDS = frozenset({"id", "object", "created", "model", "choices", "usage", "system_fingerprint",
                           "service_tier", "error"})


def _engine_fields(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in OPENAI_FIELDS}


@dataclass
class ToolCall:
    """One tool call as the server returned it; ``arguments`` is the raw JSON string."""

    name: str = ""
    arguments: str = ""
    id: str = ""
    index: int = 0

    def parsed_arguments(self) -> Any:
        """The arguments decoded from JSON (raises ``ValueError`` when they are not JSON)."""
        return json.loads(self.arguments) if self.arguments.strip() else {}


@dataclass
class ChatResult:
    """The outcome of one non-streamed chat completion. ``error`` is None on success."""

    status: int | None = None
    message: dict[str, Any] = field(default_factory=dict)
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None     # the engine's own timings block, as sent (engines.timings_block)
    seconds: float = 0.0                      # client clock: request sent -> body read
    error: str | None = None
    raw: dict[str, Any] | None = None         # the decoded response body
    engine_fields: dict[str, Any] = field(default_factory=dict)   # its fields outside OpenAI's object

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None


@dataclass
class StreamResult:
    """The outcome of one streamed chat completion, with client-clock timing.

    ``t_*`` and ``chunk_times`` are ``time.perf_counter()`` values of this process.
    ``t_first_token`` is the arrival of the first chunk carrying non-empty content or
    reasoning text (None if none came); ``t_first_delta`` also counts tool-call deltas.
    """

    status: int | None = None
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None     # the engine's own timings block, as sent (engines.timings_block)
    engine_fields: dict[str, Any] = field(default_factory=dict)   # chunks' fields outside OpenAI's object
    t_request: float = 0.0
    t_first_token: float | None = None
    t_first_delta: float | None = None
    t_end: float = 0.0
    chunks: int = 0
    chunk_times: list[float] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)   # chunks with content/reasoning text (bench: arrivals)
    done: bool = False                                         # the [DONE] sentinel arrived
    error: str | None = None
    model: str | None = None
    system_fingerprint: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None

    @property
    def ttft(self) -> float | None:
        """Seconds from sending the request to the first content/reasoning token."""
        return None if self.t_first_token is None else self.t_first_token - self.t_request

    @property
    def seconds(self) -> float:
        """Wall seconds from sending the request to the end of the stream."""
        return self.t_end - self.t_request


class ToolCallAssembler:
    """Builds whole tool calls from streamed deltas, keyed by their ``index``."""

    def __init__(self) -> None:
        self._calls: dict[int, ToolCall] = {}

    def add(self, deltas: list[Any]) -> None:
        for position, delta in enumerate(deltas):
            if not isinstance(delta, dict):
                continue
            index = delta.get("index")
            if not isinstance(index, int):
                index = position
            call = self._calls.setdefault(index, ToolCall(index=index))
            if delta.get("id") and not call.id:
                call.id = str(delta["id"])
            function = delta.get("function") or {}
            name = function.get("name")
            # OpenAI streams the name once; some servers repeat it on every delta.
            if name and name != call.name:
                call.name += name
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                call.arguments += arguments
            elif arguments is not None:     # a server that sends an object, not a string
                call.arguments += json.dumps(arguments)

    def result(self) -> list[ToolCall]:
        return [self._calls[i] for i in sorted(self._calls)]


def error_message(body: bytes | str) -> str:
    """The one-line message of an error body (OpenAI ``{"error": {"message"}}`` or raw text)."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict) and err.get("message"):
            text = str(err["message"])
        elif isinstance(err, str):
            text = err
    return (" ".join(text.split())[:300] or "(empty body)").rstrip(".")


def _text(value: Any) -> str:
    """Message content as text: a string, None, or a list of typed parts."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(p.get("text", "") for p in value if isinstance(p, dict))
    return str(value)


def _reasoning(obj: dict[str, Any]) -> str:
    # llama.cpp / SGLang / older vLLM: reasoning_content; newer vLLM: reasoning.
    # Some servers send both with the same text, so take one, never both.
    return _text(obj.get("reasoning_content") or obj.get("reasoning"))


def _sse_events(lines: Iterator[str]) -> Iterator[tuple[str, str]]:
    """(event, data) pairs from Server-Sent Events lines, per the SSE framing rules."""
    event, data = "", list[str]()
    for line in lines:
        if line == "":
            if data:
                yield event or "message", "\n".join(data)
            event, data = "", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
    if data:        # a stream that ends without the final blank line
        yield event or "message", "\n".join(data)


class SSEFeed:
    """Incremental SSE framing for bytes that arrive in pieces (one event loop reading many streams,
    ``bench.suites.streams``): every complete event's lines go through ``_sse_events``, so the framing
    rules are the same as ``stream_chat``'s; a partial line or event waits for the next piece."""

    def __init__(self) -> None:
        self._rest = b""
        self._lines: list[str] = []

    def feed(self, data: bytes) -> list[tuple[str, str]]:
        """The (event, data) pairs that ``data`` completes."""
        pieces = (self._rest + data).splitlines(keepends=True)     # bytes: splits at \r\n, \n, \r only
        # an unterminated last line, or one ending in a lone \r (its \n may be in the next piece), waits
        self._rest = pieces.pop() if pieces and not pieces[-1].endswith(b"\n") else b""
        out: list[tuple[str, str]] = []
        for piece in pieces:
            line = piece.rstrip(b"\r\n").decode("utf-8", "replace")
            if line:
                self._lines.append(line)
            elif self._lines:
                out.extend(_sse_events(iter([*self._lines, ""])))
                self._lines = []
        return out

    def close(self) -> list[tuple[str, str]]:
        """What is left when the stream ends (an event without its final blank line)."""
        tail = self._rest.rstrip(b"\r\n").decode("utf-8", "replace")
        lines, self._rest, self._lines = [*self._lines, *([tail] if tail else [])], b"", []
        return list(_sse_events(iter(lines)))


Absorb = Callable[["StreamResult", "ToolCallAssembler", str, str, float], None]


def stream_body(payload: dict[str, Any]) -> dict[str, Any]:
    """The body ``stream_chat`` sends: ``payload`` with ``stream`` and ``stream_options.include_usage`` set."""
    body = copy.deepcopy(payload)
    body["stream"] = True
    body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return body


def take_event(result: StreamResult, tools: ToolCallAssembler, event: str, data: str, now: float,
               absorb: Absorb) -> bool:
    """Fold one SSE event that arrived at ``now`` into ``result`` (``absorb``: ``OpenAIClient._absorb``
    or a subclass's); True at the ``[DONE]`` sentinel, where the stream is over."""
    if data.strip() == "[DONE]":
        result.done = True
        return True
    result.chunks += 1
    result.chunk_times.append(now)
    absorb(result, tools, event, data, now)
    return False


def finish_stream(result: StreamResult, tools: ToolCallAssembler) -> StreamResult:
    """Close a stream's bookkeeping (``t_end`` set by the caller): tool calls, and the error of a
    stream that ended with neither a finish_reason nor ``[DONE]``."""
    result.tool_calls = tools.result()
    if result.error is None and not result.done and result.finish_reason is None:
        result.error = f"stream ended after {result.chunks} chunks without finish_reason or [DONE]"
    return result


class OpenAIClient:
    """Talks to one OpenAI-compatible server at ``base_url`` (with or without ``/v1``)."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 60):
        url = base_url.rstrip("/")
        if url.endswith("/v1"):
            url = url[: -len("/v1")]
        self.base_url = url
        self.api_key = api_key
        self.timeout = float(timeout)
        headers = {"Accept": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        # loopback never through a proxy; a remote --url honours the proxy settings (net.py)
        self._http = net.client(url, base_url=url, headers=headers)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> OpenAIClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _timeout(self, timeout: float | None) -> httpx.Timeout:
        seconds = self.timeout if timeout is None else float(timeout)
        return httpx.Timeout(seconds, connect=min(seconds, 10.0))

    # -- plain JSON endpoints ------------------------------------------------------

    def get_json(self, path: str, timeout: float | None = None) -> Any:
        """GET ``path`` (e.g. ``/props``) and decode its JSON body.

        Raises NotFound when nothing answers at the URL or the path is 404, and
        EngineFailed for any other non-200 status or a body that is not JSON.
        """
        url = f"{self.base_url}{path}"
        try:
            response = self._http.get(path, timeout=self._timeout(timeout))
        except httpx.TimeoutException:
            raise EngineFailed(f"The server at {url} did not answer within "
                               f"{self._timeout(timeout).read:g} s.") from None
        except httpx.HTTPError as exc:
            raise NotFound(f"No server answers at {url} ({type(exc).__name__}: {exc}).") from None
        if response.status_code == 404:
            raise NotFound(f"The server at {url} answered 404: {error_message(response.content)}.")
        if response.status_code != 200:
            raise EngineFailed(f"The server at {url} answered HTTP {response.status_code}: "
                               f"{error_message(response.content)}.")
        try:
            return response.json()
        except ValueError:
            raise EngineFailed(f"The server at {url} answered 200 with a body that is not JSON.") from None

    def models(self, timeout: float | None = None) -> list[str]:
        """Model ids listed by ``GET /v1/models``, in the server's order."""
        url = f"{self.base_url}/v1/models"
        try:
            data = self.get_json("/v1/models", timeout=timeout)
        except NotFound as exc:
            if "answered 404" in str(exc):
                raise EngineFailed(f"The server at {self.base_url} has no /v1/models, "
                                   "so it is not an OpenAI-compatible server.") from None
            raise
        entries = data.get("data") if isinstance(data, dict) else None
        if not isinstance(entries, list) or not all(isinstance(e, dict) and "id" in e for e in entries):
            raise EngineFailed(f"The answer of {url} is not an OpenAI model list "
                               "(expected {\"data\": [{\"id\": ...}]}).")
        return [str(e["id"]) for e in entries]

    # -- chat ------------------------------------------------------------------

    def chat(self, payload: dict[str, Any], timeout: float | None = None) -> ChatResult:
        """One non-streamed ``POST /v1/chat/completions``; failures land in ``error``."""
        body = copy.deepcopy(payload)
        body["stream"] = False
        body.pop("stream_options", None)
        result = ChatResult()
        t0 = time.perf_counter()
        try:
            response = self._http.post("/v1/chat/completions", json=body, timeout=self._timeout(timeout))
        except httpx.TimeoutException:
            result.seconds = time.perf_counter() - t0
            result.error = f"no answer within {self._timeout(timeout).read:g} s"
            return result
        except httpx.HTTPError as exc:
            result.seconds = time.perf_counter() - t0
            result.error = f"{type(exc).__name__}: {exc}"
            return result
        result.seconds = time.perf_counter() - t0
        result.status = response.status_code
        if response.status_code != 200:
            result.error = f"HTTP {response.status_code}: {error_message(response.content)}"
            return result
        try:
            data = response.json()
        except ValueError:
            result.error = "the 200 answer is not JSON"
            return result
        result.raw = data
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list) or not data["choices"]:
            result.error = "the 200 answer has no choices" + (
                f" ({error_message(json.dumps(data))})" if isinstance(data, dict) and "error" in data else "")
            return result
        choice = data["choices"][0] if isinstance(data["choices"][0], dict) else {}
        message = choice.get("message") or {}
        result.message = message
        result.content = _text(message.get("content"))
        result.reasoning = _reasoning(message)
        for i, call in enumerate(message.get("tool_calls") or []):
            function = call.get("function") or {}
            arguments = function.get("arguments", "")
            index = call.get("index")
            result.tool_calls.append(ToolCall(
                name=str(function.get("name") or ""),
                arguments=arguments if isinstance(arguments, str) else json.dumps(arguments),
                id=str(call.get("id") or ""),
                index=index if isinstance(index, int) else i,
            ))
        result.finish_reason = choice.get("finish_reason")
        result.usage = data.get("usage")
        result.engine_fields = _engine_fields(data)
        result.timings = engines.timings_block(result.engine_fields) if result.engine_fields else None
        return result

    def stream_chat(self, payload: dict[str, Any], timeout: float | None = None,
                    stall_s: float | None = None) -> StreamResult:
        """One streamed ``POST /v1/chat/completions`` (SSE), timed chunk by chunk.

        Sets ``stream`` and ``stream_options.include_usage``. ``timeout`` bounds the
        connect, every read, and the whole stream's wall time; ``stall_s`` (shorter) bounds every
        read alone: no byte for that long ends the stream with an error starting "stalled".
        """
        body = stream_body(payload)
        limit = self.timeout if timeout is None else float(timeout)
        read = min(limit, float(stall_s)) if stall_s is not None and stall_s > 0 else limit
        result = StreamResult()
        tools = ToolCallAssembler()
        result.t_request = time.perf_counter()
        deadline = result.t_request + limit
        http_timeout = httpx.Timeout(limit, connect=min(limit, 10.0), read=read)
        try:
            with self._http.stream("POST", "/v1/chat/completions", json=body,
                                   timeout=http_timeout,
                                   headers={"Accept": "text/event-stream"}) as response:
                result.status = response.status_code
                if response.status_code != 200:
                    result.error = f"HTTP {response.status_code}: {error_message(response.read())}"
                    return result
                for event, data in _sse_events(response.iter_lines()):
                    now = time.perf_counter()
                    if take_event(result, tools, event, data, now, self._absorb):
                        break
                    if now > deadline:
                        result.error = result.error or f"stream still running after {limit:g} s; cut off"
                        break
        except httpx.TimeoutException:
            result.error = (f"stalled: no data for {read:g} s after {result.chunks} chunks"
                            if result.status else f"no answer within {read:g} s")
        except httpx.HTTPError as exc:
            where = f"stream broke after {result.chunks} chunks: " if result.status else ""
            result.error = f"{where}{type(exc).__name__}: {exc}"
        finally:
            result.t_end = time.perf_counter()
        return finish_stream(result, tools)

    @staticmethod
    def _absorb(result: StreamResult, tools: ToolCallAssembler, event: str, data: str, now: float) -> None:
        """Fold one SSE event into ``result``; bad chunks are recorded, never raised."""
        try:
            chunk = json.loads(data)
        except ValueError:
            if result.error is None:
                result.error = f"chunk {result.chunks} is not valid JSON: {data[:120]!r}"
            return
        if not isinstance(chunk, dict):
            if result.error is None:
                result.error = f"chunk {result.chunks} is not a JSON object: {data[:120]!r}"
            return
        if event == "error" or "error" in chunk:
            if result.error is None:
                result.error = f"server error in stream: {error_message(json.dumps(chunk))}"
            return
        result.model = result.model or chunk.get("model")
        result.system_fingerprint = result.system_fingerprint or chunk.get("system_fingerprint")
        if chunk.get("usage"):
            result.usage = chunk["usage"]
        fields = {k: v for k, v in _engine_fields(chunk).items() if v}   # the last chunk that sends one wins
        if fields:
            result.engine_fields.update(fields)
            result.timings = engines.timings_block(result.engine_fields) or result.timings
        choices = chunk.get("choices")
        try:    # a JSON chunk of the wrong shape is recorded like one that is not JSON, never raised
            for choice in choices if isinstance(choices, list) else []:
                if not isinstance(choice, dict):
                    continue
                delta = choice.get("delta") or {}
                text = _text(delta.get("content"))
                thought = _reasoning(delta)
                result.content += text
                result.reasoning += thought
                if delta.get("tool_calls"):
                    tools.add(delta["tool_calls"])
                    if result.t_first_delta is None:
                        result.t_first_delta = now
                if text or thought:
                    result.token_times.append(now)
                    if result.t_first_token is None:
                        result.t_first_token = now
                    if result.t_first_delta is None:
                        result.t_first_delta = now
                if choice.get("finish_reason"):
                    result.finish_reason = choice["finish_reason"]
        except (TypeError, AttributeError) as exc:
            if result.error is None:
                result.error = f"chunk {result.chunks} has a malformed choice ({type(exc).__name__}): {data[:120]!r}"
