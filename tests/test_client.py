"""engineroom.client against the real llama-server with SmolLM2-135M.

A small stand-in HTTP server (``StandInServer``) is used ONLY for inputs no real engine
produces on demand: a stream that breaks mid-way, a chunk that is not JSON, tool markup
leaked into content, a 200 answer that ignores response_format.
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections.abc import Callable
from typing import Any

import pytest

from engineroom.client import OpenAIClient
from engineroom.errors import EngineFailed, NotFound

# Other work shares this machine's 2 cores: SmolLM2 decodes at ~110 tok/s idle, ~3 under load.
SLOW = 300.0

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


# The real servers (plain_server, tools_server) are session fixtures in conftest.py.


def free_port(lo: int = 18100, hi: int = 18199) -> int:
    for port in range(lo, hi + 1):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {lo}-{hi}")


# -- the stand-in --------------------------------------------------------------------------


class Reply:
    """What the stand-in answers: a JSON body, or SSE events (optionally cut off mid-stream)."""

    def __init__(self, status: int = 200, body: Any = None, events: list[str] | None = None,
                 break_after: int | None = None):
        self.status, self.body, self.events, self.break_after = status, body, events, break_after


class StandInServer:
    """A tiny HTTP server in a thread that answers each path with a scripted ``Reply``.

    Only for misbehaviour a real engine will not produce on demand.
    """

    def __init__(self, routes: dict[str, Callable[[dict], Reply]]):
        self.routes = routes
        self.requests: list[dict] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                outer.requests.append({"path": self.path, "body": body})
                route = outer.routes.get(self.path)
                reply = route(body) if route else Reply(404, {"error": {"message": "no such route"}})
                if reply.events is None:
                    data = json.dumps(reply.body).encode()
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                payload = b"".join(f"data: {e}\n\n".encode() for e in reply.events[: reply.break_after])
                self.send_response(reply.status)
                self.send_header("Content-Type", "text/event-stream")
                # When breaking, promise more bytes than are sent, then drop the connection.
                extra = 1000 if reply.break_after is not None else 0
                self.send_header("Content-Length", str(len(payload) + extra))
                self.end_headers()
                self.wfile.write(payload)
                self.wfile.flush()
                if reply.break_after is not None:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)

            do_GET = do_POST = _answer

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> StandInServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def chunk(content: str | None = None, finish: str | None = None, **delta: Any) -> str:
    if content is not None:
        delta["content"] = content
    return json.dumps({"object": "chat.completion.chunk",
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


# -- tests against the real server --------------------------------------------------------

CAPITAL = {"messages": [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
           "max_tokens": 30, "temperature": 0.0, "seed": 1}


def test_models_lists_the_loaded_model(plain_server):
    with OpenAIClient(plain_server, timeout=SLOW) as client:
        assert client.models() == ["smollm2-135m"]
        # base_url may carry /v1, as OpenAI SDK users write it
        assert OpenAIClient(plain_server + "/v1/", timeout=SLOW).models() == ["smollm2-135m"]


def test_chat_returns_answer_usage_and_engine_timings(plain_server):
    r = OpenAIClient(plain_server, timeout=SLOW).chat(CAPITAL)
    assert r.ok, r.error
    assert "Paris" in r.content
    assert r.message["role"] == "assistant"
    assert r.finish_reason == "stop"
    assert r.usage["completion_tokens"] > 0
    assert r.timings["predicted_n"] == r.usage["completion_tokens"]   # llama.cpp's own figures
    assert 0 < r.seconds < 30


def test_stream_chat_times_every_chunk_on_the_client_clock(plain_server):
    client = OpenAIClient(plain_server, timeout=SLOW)
    payload = {**CAPITAL, "max_tokens": 40}
    before = json.dumps(payload)
    r = client.stream_chat(payload)
    assert json.dumps(payload) == before, "stream_chat must not modify the caller's payload"
    assert r.ok and r.done, r.error
    assert r.content == client.chat(payload).content        # same text, streamed or not (greedy)
    assert r.t_request < r.t_first_token <= r.t_end
    assert r.chunks == len(r.chunk_times) >= len(r.token_times) >= 5
    assert r.chunk_times == sorted(r.chunk_times)
    assert r.token_times[0] == r.t_first_token
    assert 0 < r.ttft < r.seconds
    assert r.usage["completion_tokens"] >= len(r.token_times) - 1   # include_usage was sent
    assert r.timings and r.timings["predicted_n"] == r.usage["completion_tokens"]
    assert r.finish_reason == "stop"


def test_http_error_is_recorded_not_raised(plain_server):
    client = OpenAIClient(plain_server, timeout=SLOW)
    too_long = {"messages": [{"role": "user", "content": "word " * 5000}], "max_tokens": 5}
    for r in (client.chat(too_long), client.stream_chat(too_long)):
        assert r.status == 400 and not r.ok
        assert r.error.startswith("HTTP 400: ") and "context" in r.error


def test_tools_are_silently_ignored_with_smollm2s_own_template(plain_server):
    """The finding behind the tool template: 200, prose, no tool call, no grammar."""
    client = OpenAIClient(plain_server, timeout=SLOW)
    caps = client.get_json("/props")["chat_template_caps"]
    assert caps["supports_tools"] is False and caps["supports_tool_calls"] is False
    r = client.chat({"messages": [{"role": "user", "content": "What is the weather in Paris?"}],
                     "tools": [WEATHER_TOOL], "tool_choice": "required", "max_tokens": 40, "temperature": 0})
    assert r.status == 200 and r.tool_calls == [] and r.content


def test_streamed_tool_call_is_assembled_from_deltas(tools_server):
    client = OpenAIClient(tools_server, timeout=SLOW)
    assert client.get_json("/props")["chat_template_caps"]["supports_tool_calls"] is True
    payload = {"messages": [{"role": "user", "content": "What is the weather in Paris?"}],
               "tools": [WEATHER_TOOL], "tool_choice": "required", "max_tokens": 100, "temperature": 0}
    s = client.stream_chat(payload)
    assert s.ok, s.error
    assert s.finish_reason == "tool_calls"
    assert [(c.index, c.name) for c in s.tool_calls] == [(0, "get_weather")]
    assert s.tool_calls[0].id
    assert s.tool_calls[0].parsed_arguments() == {"city": "Paris"}
    assert s.content == "" and s.t_first_token is None and s.t_first_delta > s.t_request
    c = client.chat(payload)
    assert [(t.name, t.parsed_arguments()) for t in c.tool_calls] == [("get_weather", {"city": "Paris"})]


def test_unreachable_url_raises_not_found_naming_it():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(NotFound, match=rf"No server answers at {url}/v1/models"):
        OpenAIClient(url).models()
    r = OpenAIClient(url).stream_chat(CAPITAL)
    assert r.status is None and r.error.startswith("ConnectError")


def test_non_openai_server_raises_engine_failed(tmp_path):
    """A real, ordinary web server (python's file server) is not an OpenAI server."""
    (tmp_path / "index.html").write_text("<html>hello</html>")
    handler = lambda *a, **kw: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path), **kw)  # noqa: E731
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        with pytest.raises(EngineFailed, match=rf"{url} has no /v1/models"):
            OpenAIClient(url).models()
        with pytest.raises(EngineFailed, match="not JSON"):
            OpenAIClient(url).get_json("/index.html")
    finally:
        httpd.shutdown()
        httpd.server_close()


# -- stand-in: misbehaviour no real engine produces on demand -------------------------------


def test_stream_broken_midway_keeps_what_arrived():
    events = [chunk(role="assistant"), chunk("Hello"), chunk(" wor"), chunk("ld", "stop"), "[DONE]"]
    with StandInServer({"/v1/chat/completions": lambda b: Reply(events=events, break_after=3)}) as srv:
        r = OpenAIClient(srv.url).stream_chat(CAPITAL, timeout=10)
    assert r.status == 200 and not r.ok
    assert r.content == "Hello wor"
    assert r.chunks == 3 and not r.done
    assert r.error.startswith("stream broke after 3 chunks: RemoteProtocolError")


def test_chunk_with_invalid_json_is_recorded_and_the_rest_still_read():
    events = [chunk("A"), '{"choices": [{"delta": {"content": "B"', chunk("C", "stop"), "[DONE]"]
    with StandInServer({"/v1/chat/completions": lambda b: Reply(events=events)}) as srv:
        r = OpenAIClient(srv.url).stream_chat(CAPITAL, timeout=10)
        sent = srv.requests[-1]["body"]
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert r.content == "AC" and r.finish_reason == "stop" and r.done
    assert r.error.startswith("chunk 2 is not valid JSON")


def test_tool_markup_leaked_into_content_stays_content():
    """The client reports what the server sent; judging the leak is the check's job."""
    leaked = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    events = [chunk(leaked[:20]), chunk(leaked[20:], "stop"), "[DONE]"]
    with StandInServer({"/v1/chat/completions": lambda b: Reply(events=events)}) as srv:
        r = OpenAIClient(srv.url).stream_chat(CAPITAL, timeout=10)
    assert r.ok and r.tool_calls == [] and r.content == leaked


def test_stream_ending_without_finish_or_done_is_an_error():
    with StandInServer({"/v1/chat/completions": lambda b: Reply(events=[chunk("Hi")])}) as srv:
        r = OpenAIClient(srv.url).stream_chat(CAPITAL, timeout=10)
    assert r.content == "Hi" and r.error == "stream ended after 1 chunks without finish_reason or [DONE]"


# -- proxies: loopback never goes through one; a remote --url still does -------------------

DEAD_PROXY = "http://127.0.0.1:9"     # the discard port, closed here: anything sent to it fails

PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


@pytest.fixture
def dead_proxy(monkeypatch):
    """A corporate-style environment: every proxy variable set to a dead proxy, NO_PROXY unset."""
    for var in PROXY_VARS:
        monkeypatch.setenv(var, DEAD_PROXY)
    for var in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    return DEAD_PROXY


@pytest.mark.parametrize("url, loopback", [
    ("http://127.0.0.1:8080", True), ("http://127.5.0.1", True), ("http://localhost:1/v1", True),
    ("http://LOCALHOST.:1", True), ("http://api.localhost", True), ("http://[::1]:8080", True),
    ("http://0.0.0.0:8080", True), ("http://[::ffff:127.0.0.1]:9", True),
    ("http://gpu-box:8000", False), ("https://10.0.0.1", False), ("http://128.0.0.1", False),
    ("http://localhost.example.com", False), ("not a url", False),
])
def test_is_loopback(url, loopback):
    from engineroom import net

    assert net.is_loopback(url) is loopback


def test_loopback_bypasses_a_dead_proxy_for_client_detect_probe_and_health(plain_server, dead_proxy):
    """The bug: with HTTP_PROXY set, health and probes to 127.0.0.1 went to the proxy."""
    import httpx

    from engineroom import launch
    from engineroom.engines import detect, llamacpp

    # the environment really is broken for a client that trusts it: it dials the dead proxy
    with pytest.raises((httpx.ProxyError, httpx.ConnectError)):
        httpx.get(f"{plain_server}/health", timeout=5)
    assert launch.probe_health(plain_server, "/health") == 200
    info = llamacpp.probe(plain_server)
    assert info is not None and info.engine == "llama.cpp"
    assert detect(plain_server).engine == "llama.cpp"
    localhost = plain_server.replace("127.0.0.1", "localhost")
    with OpenAIClient(localhost, timeout=SLOW) as client:
        assert client.models()
        result = client.stream_chat(CAPITAL, timeout=SLOW)
    assert result.ok and result.content, result.error


def test_a_remote_url_still_honours_the_proxy(monkeypatch):
    """A stand-in proxy (a real engine is no proxy): a non-loopback --url goes through HTTP_PROXY."""
    models = {"object": "list", "data": [{"id": "remote-model"}]}
    with StandInServer({"http://gpu-box.invalid:8000/v1/models": lambda _b: Reply(body=models)}) as proxy:
        for var in PROXY_VARS:
            monkeypatch.setenv(var, proxy.url)
        for var in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(var, raising=False)
        with OpenAIClient("http://gpu-box.invalid:8000/v1") as client:
            assert client.models() == ["remote-model"]
        assert [r["path"] for r in proxy.requests] == ["http://gpu-box.invalid:8000/v1/models"]
        # and NO_PROXY, the user's own exception list, is still honoured for remote hosts
        monkeypatch.setenv("NO_PROXY", "gpu-box.invalid")
        with OpenAIClient("http://gpu-box.invalid:8000") as client:
            with pytest.raises(NotFound):
                client.models()
        assert len(proxy.requests) == 1
