"""A deliberately fast stand-in OpenAI-compatible SSE server (not an engine: it generates nothing).

Used by ``client_ceiling.py`` to find how many streams and tokens per second a *client* can take,
with the server side known not to be the limit. One thread, one epoll loop over non-blocking
sockets, no asyncio, no framework; every chunk's bytes are built once per stream and written with
one ``send`` per token, as llama-server writes one SSE event per token.

What it does:

- ``POST /v1/chat/completions`` (and ``/v1/completions``) with ``"stream": true``: answers with
  ``text/event-stream`` (HTTP/1.1 chunked, keep-alive) and streams ``max_tokens`` (or
  ``max_completion_tokens``; default 256) ``chat.completion.chunk`` events, token *i* due at
  ``t_request + first_ms + i / rate`` (``rate`` tokens/s per stream, set per phase through the
  control endpoint), then a ``finish_reason: "length"``
  chunk, a usage chunk (``completion_tokens`` = tokens sent) and ``data: [DONE]``. Non-streamed
  requests get one JSON completion of the same size at once.
- It logs its own send time of every token: ``time.time_ns()`` (wall clock, for clients that stamp
  with ``time.time``) and ``time.monotonic_ns()`` (``CLOCK_MONOTONIC``, the clock of
  ``time.perf_counter`` on Linux, for clients that stamp with that), taken right after the
  ``send`` returned; and per stream the monotonic time the request was parsed, and the first 160
  characters of the last message (how a client's record is matched to the server's stream).
- Its own CPU time (``resource.getrusage``), how late each paced send was against its due time,
  bytes it had to hold back because a socket was full, and the number of open streams sampled
  every 50 ms: the proof that it was not the limit.
- ``POST /standin/phase {"rate": R, "first_ms": F, "label": "..."}`` starts a phase (logs reset);
  ``POST /standin/dump {"path": "..."}`` writes the phase's log as JSON and answers the summary.
- ``GET /v1/models`` and ``GET /health``: all the clients ask for besides completions.

Run: ``python benchmarks/standin_sse.py --port 8399`` (``client_ceiling.py`` starts it pinned to
its own core with ``taskset``).
"""

from __future__ import annotations

import argparse
import heapq
import json
import resource
import selectors
import socket
import sys
import time
from array import array
from typing import Any

MODEL = "standin"
_HDR_END = b"\r\n\r\n"
_SSE_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
             b"Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n")


def _chunk(payload: bytes) -> bytes:
    """One HTTP/1.1 chunk holding one SSE event."""
    event = b"data: " + payload + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(event), event)


def _json_response(obj: Any, status: str = "200 OK") -> bytes:
    body = json.dumps(obj).encode()
    return (b"HTTP/1.1 " + status.encode() + b"\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\nConnection: keep-alive\r\n\r\n" + body)


class Stream:
    __slots__ = ("sid", "conn", "n", "sent", "t0", "key", "wall", "mono", "token", "done_bytes", "due",
                 "interval", "late_ns")

    def __init__(self, sid: int, conn: Conn, n: int, key: str, t0: int, first_ns: int, interval_ns: int,
                 chat: bool, include_usage: bool) -> None:
        self.sid, self.conn, self.n, self.sent, self.t0, self.key = sid, conn, n, 0, t0, key
        self.wall = array("q")
        self.mono = array("q")
        self.late_ns = array("q")
        created = int(time.time())
        ident = f"chatcmpl-standin-{sid}"
        obj = "chat.completion.chunk" if chat else "text_completion"

        def piece(text: str | None, finish: str | None) -> bytes:
            if chat:
                delta = {} if text is None else {"content": text}
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text or "", "finish_reason": finish}
            return _chunk(json.dumps({"id": ident, "object": obj, "created": created, "model": MODEL,
                                      "choices": [choice]}, separators=(",", ":")).encode())

        # token 0 names the stream (so a client's stored text can be matched too); the rest one word each
        self.token = (piece(f"s{sid}", None), piece(" the", None))
        tail = piece(None, "length")
        if include_usage:
            usage = {"prompt_tokens": max(1, len(key) // 4), "completion_tokens": n,
                     "total_tokens": max(1, len(key) // 4) + n}
            tail += _chunk(json.dumps({"id": ident, "object": obj, "created": created, "model": MODEL,
                                       "choices": [], "usage": usage}, separators=(",", ":")).encode())
        self.done_bytes = tail + _chunk(b"[DONE]") + b"0\r\n\r\n"
        self.due = t0 + first_ns
        self.interval = interval_ns


class Conn:
    __slots__ = ("sock", "rbuf", "wbuf", "stream", "fd", "closed")

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.rbuf, self.wbuf, self.stream, self.fd, self.closed = sock, b"", b"", None, sock.fileno(), False


class Server:
    def __init__(self, port: int) -> None:
        self.sel = selectors.DefaultSelector()
        self.lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", port))
        self.lsock.listen(4096)
        self.lsock.setblocking(False)
        self.sel.register(self.lsock, selectors.EVENT_READ, None)
        self.heap: list[tuple[int, int, Stream]] = []
        self.seq = 0
        self.rate = 100.0
        self.first_ns = 20_000_000
        self.label = ""
        self._reset()

    # -- phases ------------------------------------------------------------------------------
    def _reset(self) -> None:
        self.streams: list[Stream] = []
        self.open = 0
        self.max_open = 0
        self.held_back_bytes = 0
        self.held_back_events = 0
        self.samples = array("q")          # (mono_ns, open streams) pairs, every 50 ms
        self.next_sample = time.monotonic_ns()
        self.phase_t0 = time.monotonic_ns()
        self.phase_wall0 = time.time_ns()
        ru = resource.getrusage(resource.RUSAGE_SELF)
        self.cpu0 = ru.ru_utime + ru.ru_stime
        self.requests = 0
        self.errors = 0

    def summary(self) -> dict[str, Any]:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        now = time.monotonic_ns()
        sent = sum(s.sent for s in self.streams)
        late = sorted(x for s in self.streams for x in s.late_ns)
        first = min((s.mono[0] for s in self.streams if s.sent), default=now)
        last = max((s.mono[-1] for s in self.streams if s.sent), default=now)

        def q(p: float) -> float | None:
            return late[min(len(late) - 1, int(p * len(late)))] / 1e6 if late else None

        return {"label": self.label, "rate_per_stream": self.rate, "first_ms": self.first_ns / 1e6,
                "wall_s": (now - self.phase_t0) / 1e9, "cpu_s": ru.ru_utime + ru.ru_stime - self.cpu0,
                "requests": self.requests, "errors": self.errors, "streams": len(self.streams),
                "tokens_sent": sent, "first_send_mono_ns": first, "last_send_mono_ns": last,
                "max_open": self.max_open, "held_back_bytes": self.held_back_bytes,
                "held_back_events": self.held_back_events,
                "send_late_ms": {"p50": q(0.5), "p99": q(0.99), "max": late[-1] / 1e6 if late else None}}

    def dump(self, path: str) -> dict[str, Any]:
        out = self.summary()
        out["open_samples"] = list(self.samples)
        out["stream_log"] = [{"sid": s.sid, "key": s.key, "t0_mono_ns": s.t0, "n": s.n, "sent": s.sent,
                              "mono_ns": list(s.mono), "wall_ns": list(s.wall)} for s in self.streams]
        with open(path, "w") as fh:
            json.dump(out, fh)
        return self.summary()

    # -- HTTP --------------------------------------------------------------------------------
    def _close(self, c: Conn) -> None:
        if c.closed:
            return
        c.closed = True
        if c.stream is not None:
            self.open -= 1
            c.stream = None
        try:
            self.sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        c.sock.close()

    def _write(self, c: Conn, data: bytes) -> bool:
        """Write now; what the socket cannot take waits in c.wbuf (counted). False if the peer is gone."""
        if c.wbuf:
            c.wbuf += data
            self.held_back_bytes += len(data)
            return True
        try:
            n = c.sock.send(data)
        except BlockingIOError:
            n = 0
        except OSError:
            self._close(c)
            return False
        if n < len(data):
            c.wbuf = data[n:]
            self.held_back_bytes += len(data) - n
            self.held_back_events += 1
            self.sel.modify(c.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, c)
        return True

    def _flush(self, c: Conn) -> None:
        try:
            n = c.sock.send(c.wbuf)
        except BlockingIOError:
            return
        except OSError:
            self._close(c)
            return
        c.wbuf = c.wbuf[n:]
        if not c.wbuf:
            self.sel.modify(c.sock, selectors.EVENT_READ, c)

    def _read(self, c: Conn) -> None:
        try:
            data = c.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close(c)
            return
        c.rbuf += data
        while not c.closed:
            end = c.rbuf.find(_HDR_END)
            if end < 0:
                return
            head = c.rbuf[:end].decode("latin-1")
            lines = head.split("\r\n")
            method, path = (lines[0].split(" ") + ["", ""])[:2]
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            if len(c.rbuf) < end + 4 + length:
                return
            body = c.rbuf[end + 4:end + 4 + length]
            c.rbuf = c.rbuf[end + 4 + length:]
            self._route(c, method, path.split("?")[0], body)

    def _route(self, c: Conn, method: str, path: str, body: bytes) -> None:
        if method == "GET" and path in ("/v1/models", "/models"):
            self._write(c, _json_response({"object": "list", "data": [{"id": MODEL, "object": "model",
                                                                        "owned_by": "standin"}]}))
        elif method == "GET" and path == "/health":
            self._write(c, _json_response({"status": "ok"}))
        elif method == "POST" and path == "/standin/phase":
            cfg = json.loads(body or b"{}")
            self.rate = float(cfg.get("rate", self.rate))
            self.first_ns = int(float(cfg.get("first_ms", self.first_ns / 1e6)) * 1e6)
            self.label = str(cfg.get("label", ""))
            self._reset()
            self._write(c, _json_response({"ok": True}))
        elif method == "POST" and path == "/standin/dump":
            cfg = json.loads(body or b"{}")
            self._write(c, _json_response(self.dump(cfg["path"]) if cfg.get("path") else self.summary()))
        elif method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            self._completion(c, path.endswith("chat/completions"), body)
        else:
            self._write(c, _json_response({"error": {"message": f"no route {method} {path}"}}, "404 Not Found"))

    def _completion(self, c: Conn, chat: bool, body: bytes) -> None:
        t0 = time.monotonic_ns()
        self.requests += 1
        try:
            req = json.loads(body)
        except ValueError:
            self.errors += 1
            self._write(c, _json_response({"error": {"message": "body is not JSON"}}, "400 Bad Request"))
            return
        n = int(req.get("max_completion_tokens") or req.get("max_tokens") or 256)
        if chat:
            msgs = req.get("messages") or [{}]
            content = msgs[-1].get("content", "")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        else:
            content = req.get("prompt", "")
            content = content if isinstance(content, str) else json.dumps(content)
        key = str(content)[:160]
        if not req.get("stream"):
            text = " ".join(["the"] * n)
            msg = ({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
            usage = {"prompt_tokens": max(1, len(key) // 4), "completion_tokens": n,
                     "total_tokens": max(1, len(key) // 4) + n}
            self._write(c, _json_response({"id": "cmpl-standin", "object": "chat.completion" if chat else
                                           "text_completion", "created": int(time.time()), "model": MODEL,
                                           "choices": [{"index": 0, "finish_reason": "length", **msg}],
                                           "usage": usage}))
            return
        include_usage = bool((req.get("stream_options") or {}).get("include_usage", True))
        interval = int(1e9 / max(self.rate, 1e-3))
        s = Stream(len(self.streams), c, n, key, t0, self.first_ns, interval, chat, include_usage)
        self.streams.append(s)
        c.stream = s
        self.open += 1
        self.max_open = max(self.max_open, self.open)
        if not self._write(c, _SSE_HEAD):
            return
        self.seq += 1
        heapq.heappush(self.heap, (s.due, self.seq, s))

    # -- the loop ----------------------------------------------------------------------------
    def _send_token(self, s: Stream, now: int) -> None:
        c = s.conn
        if c.closed or c.stream is not s:
            return
        data = s.token[1 if s.sent else 0]
        if not self._write(c, data):
            return
        s.wall.append(time.time_ns())
        s.mono.append(time.monotonic_ns())
        s.late_ns.append(now - s.due)
        s.sent += 1
        if s.sent >= s.n:
            self.open -= 1
            c.stream = None
            self._write(c, s.done_bytes)
            return
        s.due += s.interval
        self.seq += 1
        heapq.heappush(self.heap, (s.due, self.seq, s))

    def serve(self) -> None:
        heap, sel = self.heap, self.sel
        while True:
            now = time.monotonic_ns()
            # epoll's timeout is whole milliseconds: wait on it only when the next token is over 1.5 ms
            # away (waking 1 ms early), else just poll, then sleep the rest (clock_nanosleep, not a spin)
            wait_ns = 50_000_000 if not heap else heap[0][0] - now
            timeout = min(wait_ns - 1_000_000, 50_000_000) / 1e9 if wait_ns > 1_500_000 else 0.0
            for key, mask in sel.select(timeout):
                if key.data is None:
                    while True:
                        try:
                            sock, _ = self.lsock.accept()
                        except BlockingIOError:
                            break
                        sock.setblocking(False)
                        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        conn = Conn(sock)
                        sel.register(sock, selectors.EVENT_READ, conn)
                    continue
                c = key.data
                if mask & selectors.EVENT_WRITE and c.wbuf:
                    self._flush(c)
                if mask & selectors.EVENT_READ and not c.closed:
                    self._read(c)
            now = time.monotonic_ns()
            if heap and 0 < heap[0][0] - now < 1_500_000:
                time.sleep((heap[0][0] - now) / 1e9)
                now = time.monotonic_ns()
            while heap and heap[0][0] <= now:
                _, _, s = heapq.heappop(heap)
                self._send_token(s, now)
            if now >= self.next_sample:
                self.samples.append(now)
                self.samples.append(self.open)
                self.next_sample = now + 50_000_000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=8399)
    ap.add_argument("--rate", type=float, default=100.0, help="tokens/s per stream until a phase sets it")
    args = ap.parse_args()
    server = Server(args.port)
    server.rate = args.rate
    print(f"stand-in listening on 127.0.0.1:{args.port}", flush=True)
    try:
        server.serve()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
