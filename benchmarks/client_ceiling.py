"""Client ceiling, side by side: engineroom's streaming client vs aiperf and guidellm on a stand-in server.

Why this exists (issue 9, "Performance bars"): a bench whose client cannot keep up reports the
client, not the engine. This measures how many streams and streamed tokens per second each
client takes on this machine, and how close its per-token timestamps are to the moment the
server sent each token, against ``standin_sse.py`` -- a deliberately fast stand-in
OpenAI-compatible SSE server (not an engine) that paces tokens at a set rate per stream and
logs its own send time of every token.

In one run, interleaved (the machine is shared, so drift hits every client alike):

- the stand-in pinned to core ``--server-core`` (``taskset``), each client pinned to
  ``--client-core``; this script's own sampling thread sits with the stand-in;
- per cell (``--streams`` N x ``--rates`` tokens/s per stream; asked aggregate = N x rate), per
  repetition, each client in a rotated order, doing the same work: N concurrent streams, N x
  (rounds + 1) requests of ``--max-tokens`` tokens, 64-token prompts:
  - **engineroom**: ``bench.suites.run.run_suite`` with the ``concurrency`` suite (one warm-up round +
    rounds of N simultaneous streams, every stream on one event loop: ``bench.suites.streams``, aiohttp,
    ``KindClient._absorb`` per event, ``ClientMonitor`` running) -- the code path of
    ``engineroom bench concurrency --streams N``, with the client class's ``_absorb`` wrapped to
    keep each result's absolute ``t_request`` and token arrival times (the bench record stores them
    relative to the send) -- run in a subprocess of this script;
  - **aiperf** 0.13.0 (``aiperf profile --concurrency N --streaming --use-server-token-count
    --export-level raw``; per-chunk ``perf_ns`` from its raw export);
  - **guidellm** 0.8.1 (``guidellm run --profile kind=concurrent,streams=N``; it keeps the first and
    the last token's ``time.time()`` of each request only, so its error is measured at those two);
- from the stand-in's log: streams held (open streams sampled every 50 ms, mean over the middle
  80% of the active span), tokens sent per second over that window vs asked, how late its paced
  sends were against their schedule, its CPU time; from the client's own timestamps: tokens it
  received per second over the same window, and per token (client arrival - server send) on the
  same clock (``CLOCK_MONOTONIC`` for engineroom's ``perf_counter`` and aiperf's
  ``perf_counter_ns``, the wall clock for guidellm's ``time.time``); client CPU (its process tree,
  psutil) and the machine's other load (``/proc/stat`` minus our processes).

The tools get a local tokenizer folder written from the SmolLM2 GGUF's own vocabulary
(``hf_tokenizer.py``); the hub is unreachable here. They are not project dependencies: each is
pip-installed into its own venv (``--aiperf`` / ``--guidellm`` name the executables).

    python3.11 -m venv /tmp/aiperf-venv && /tmp/aiperf-venv/bin/pip install aiperf==0.13.0
    python3.11 -m venv /tmp/guidellm-venv && /tmp/guidellm-venv/bin/pip install guidellm==0.8.1
    .venv/bin/python benchmarks/client_ceiling.py --streams 256 --rates 50 100 200 --reps 2 \
        --out-json benchmarks/data/client_ceiling.json
    .venv/bin/python benchmarks/client_ceiling.py --report benchmarks/data/client_ceiling.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
CLIENTS = ("engineroom", "aiperf", "guidellm")
# not shipped: engineroom's parser on one event loop over a raw asyncio.Protocol, httpx.AsyncClient, aiohttp
# (the last is what bench.suites.streams ships, minus the suite around it; kept to re-measure the HTTP layer)
PROTOTYPES = ("async-prototype", "async-httpx-prototype", "async-aiohttp-prototype")
PROTOTYPE = PROTOTYPES[0]
PROMPT_TOKENS = 64
FIRST_MS = 20.0
TARGETS = {"streams": 256, "tok_s": 25_000, "median_error_ms": 0.5}


# ------------------------------------------------------------------------------------------ engineroom side
def engineroom_client(url: str, streams: int, rounds: int, max_tokens: int, out: Path) -> None:
    """Runs in the pinned subprocess: engineroom's concurrency suite against the stand-in."""
    from engineroom.bench.clientside import KindClient
    from engineroom.bench.stats import CLIENT_LOAD_KIND
    from engineroom.bench.suites.context import SuiteContext
    from engineroom.bench.suites.run import run_suite
    from engineroom.bench.suites.specs import SUITE_SPECS
    from engineroom.engines.base import ServerInfo

    tap: dict[int, tuple[Any, str | None]] = {}     # id(result) -> (result, the stand-in's chunk id)

    class Tapped(KindClient):
        """KindClient whose results are also kept here, with their absolute clock (the record stores
        arrivals relative to the send) and the stand-in's chunk id (which server stream it was). The
        suite reads the streams on its one event loop (``bench.suites.streams``) and calls this ``_absorb``
        for every event, so the path measured is the shipped one; one ``json.loads`` per request extra."""

        @staticmethod
        def _absorb(result: Any, tools: Any, event: str, data: str, now: float) -> None:
            if id(result) not in tap:
                try:
                    tap[id(result)] = (result, json.loads(data).get("id"))
                except (ValueError, AttributeError):
                    tap[id(result)] = (result, None)
            KindClient._absorb(result, tools, event, data, now)

    spec = SUITE_SPECS["concurrency"].with_(warmup=1, rounds=rounds, max_tokens=max_tokens,
                                            prompt_tokens=PROMPT_TOKENS)
    info = ServerInfo(url=url, engine="standin", model_id="standin", n_ctx=8192, total_slots=streams)
    ctx = SuiteContext(server=info, new_client=lambda: Tapped(url, timeout=600), streams=streams)
    result = run_suite(spec, ctx)
    load = next((r["payload"] for r in result.records if r["kind"] == CLIENT_LOAD_KIND), None)
    summary = result.summary
    group = next(iter((summary.get("groups") or {}).values()), {})
    out.write_text(json.dumps({
        "requests": [{"sid": _sid(cid), "t_request_ns": round(r.t_request * 1e9),
                      "tokens_ns": [round(x * 1e9) for x in r.token_times], "status": r.status}
                     for r, cid in tap.values()],
        "client_load": load,
        "summary": {"status": summary.get("status"), "valid": summary.get("valid"),
                    "integrity": summary.get("integrity"), "client_load": summary.get("client_load"),
                    "aggregate_tps": group.get("aggregate_tps"), "warnings": summary.get("warnings")},
    }))


def async_prototype_client(url: str, streams: int, rounds: int, max_tokens: int, out: Path,
                           transport: str = "raw") -> None:
    """NOT engineroom's shipped client: the fix this benchmark points at, measured beside it. The same
    request body and per-chunk bookkeeping (``KindClient._absorb`` into a ``StreamResult``) as
    engineroom's client, but every stream in one asyncio event loop instead of one thread (and one
    ``httpx.Client``) per stream; each stream runs rounds + 1 requests back to back (closed loop).

    ``transport="raw"``: an ``asyncio.Protocol`` that reads HTTP/1.1 chunked SSE itself and stamps every
    event with the time its bytes were received (one ``perf_counter`` per read); ``"httpx"``: the same
    loop over ``httpx.AsyncClient.stream`` / ``aiter_lines`` (what swapping the client class would give)."""
    import asyncio

    from engineroom.bench.clientside import KindClient
    from engineroom.bench.suites.haystack import fresh_salt, haystack
    from engineroom.client import StreamResult, ToolCallAssembler, _sse_events

    tap: list[tuple[str, float, list[float], int | None]] = []
    host, port = url.split("//", 1)[1].split(":")

    def body(prompt: str) -> bytes:
        return json.dumps({"model": "standin", "messages": [{"role": "user", "content": prompt}],
                           "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True},
                           "temperature": 0.0, "top_k": 1}).encode()

    class Stream(asyncio.Protocol):
        def __init__(self) -> None:
            self.buf = b""
            self.done: asyncio.Future | None = None

        def connection_made(self, transport: Any) -> None:
            self.transport = transport

        def send(self, prompt: str) -> asyncio.Future:
            self.prompt, payload = prompt, body(prompt)
            self.result, self.tools = StreamResult(), ToolCallAssembler()
            self.headers, self.sse, self.done = True, b"", asyncio.get_running_loop().create_future()
            self.result.t_request = time.perf_counter()
            self.transport.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json"
                                 b"\r\nAccept: text/event-stream\r\nContent-Length: %d\r\n\r\n%s"
                                 % (host.encode(), len(payload), payload))
            return self.done

        def data_received(self, data: bytes) -> None:
            now = time.perf_counter()
            self.buf += data
            r = self.result
            if self.headers:
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                r.status = int(self.buf[9:12])
                self.buf, self.headers = self.buf[end + 4:], False
            while True:                                   # HTTP/1.1 chunks
                eol = self.buf.find(b"\r\n")
                if eol < 0:
                    return
                size = int(self.buf[:eol], 16)
                if len(self.buf) < eol + 2 + size + 2:
                    return
                chunk, self.buf = self.buf[eol + 2:eol + 2 + size], self.buf[eol + 4 + size:]
                if size == 0:
                    r.t_end = now
                    tap.append((self.prompt[:160], r.t_request, r.token_times, r.status))
                    if self.done is not None and not self.done.done():
                        self.done.set_result(None)
                    return
                self.sse += chunk
                while b"\n\n" in self.sse:               # SSE events, framed as client._sse_events does
                    raw, self.sse = self.sse.split(b"\n\n", 1)
                    for event, text in _sse_events(iter([*raw.decode().split("\n"), ""])):
                        if text.strip() == "[DONE]":
                            r.done = True
                            continue
                        r.chunks += 1
                        r.chunk_times.append(now)
                        KindClient._absorb(r, self.tools, event, text, now)

    async def raw_loop() -> None:
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_connection(Stream, host, int(port))
        for _ in range(rounds + 1):
            await proto.send(haystack(fresh_salt(), PROMPT_TOKENS).text)
        proto.transport.close()

    async def httpx_loop(http: Any) -> None:
        for _ in range(rounds + 1):
            prompt = haystack(fresh_salt(), PROMPT_TOKENS).text
            r, tools = StreamResult(), ToolCallAssembler()
            r.t_request = time.perf_counter()
            async with http.stream("POST", "/v1/chat/completions", content=body(prompt),
                                   headers={"Accept": "text/event-stream", "Content-Type": "application/json"}) as resp:
                r.status = resp.status_code
                buf: list[str] = []
                async for line in resp.aiter_lines():
                    if line:
                        buf.append(line)
                        continue
                    for event, text in _sse_events(iter([*buf, ""])):
                        now = time.perf_counter()
                        if text.strip() != "[DONE]":
                            r.chunks += 1
                            KindClient._absorb(r, tools, event, text, now)
                    buf = []
            tap.append((prompt[:160], r.t_request, r.token_times, r.status))

    async def aiohttp_loop(http: Any) -> None:
        for _ in range(rounds + 1):
            prompt = haystack(fresh_salt(), PROMPT_TOKENS).text
            r, tools = StreamResult(), ToolCallAssembler()
            r.t_request = time.perf_counter()
            async with http.post(f"{url}/v1/chat/completions", data=body(prompt),
                                 headers={"Accept": "text/event-stream", "Content-Type": "application/json"}) as resp:
                r.status = resp.status
                sse = b""
                while True:
                    data = await resp.content.readany()
                    if not data:
                        break
                    now = time.perf_counter()
                    sse += data
                    while b"\n\n" in sse:
                        raw, sse = sse.split(b"\n\n", 1)
                        for event, text in _sse_events(iter([*raw.decode().split("\n"), ""])):
                            if text.strip() != "[DONE]":
                                r.chunks += 1
                                KindClient._absorb(r, tools, event, text, now)
            tap.append((prompt[:160], r.t_request, r.token_times, r.status))

    async def main() -> None:
        if transport == "raw":
            await asyncio.gather(*(raw_loop() for _ in range(streams)))
            return
        if transport == "aiohttp":
            import aiohttp

            conn = aiohttp.TCPConnector(limit=streams)
            async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as http:
                await asyncio.gather(*(aiohttp_loop(http) for _ in range(streams)))
            return
        import httpx

        limits = httpx.Limits(max_connections=streams, max_keepalive_connections=streams)
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=600, trust_env=False) as http:
            await asyncio.gather(*(httpx_loop(http) for _ in range(streams)))

    asyncio.run(main())
    out.write_text(json.dumps({"requests": [{"key": k, "t_request_ns": round(t * 1e9),
                                             "tokens_ns": [round(x * 1e9) for x in times], "status": st}
                                            for k, t, times, st in tap]}))


# ------------------------------------------------------------------------------------------ the stand-in
def _post(url: str, obj: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(obj).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def start_standin(port: int, core: int, realtime: bool) -> subprocess.Popen:
    # SCHED_FIFO priority 1 (the lowest real-time one): on a machine shared with other work the stand-in is
    # served first on its core whenever it has a token due, so neighbours cannot make it the limit; it sleeps
    # between tokens, so they keep the rest of that core (and the kernel caps real-time use at 95%)
    rt = ["chrt", "-f", "1"] if realtime else []
    proc = subprocess.Popen(["taskset", "-c", str(core), *rt, sys.executable, str(HERE / "standin_sse.py"),
                             "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening" not in line:
        proc.kill()
        raise SystemExit(f"the stand-in did not start: {line}")
    return proc


# ------------------------------------------------------------------------------------------ sampling
class Sampler:
    """CPU of the stand-in and the client tree, and /proc/stat per core, every 0.25 s."""

    def __init__(self, server_pid: int) -> None:
        self.server = psutil.Process(server_pid)
        self.client: psutil.Process | None = None
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._seen: dict[int, psutil.Process] = {}
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def cores() -> list[int]:
        out = []
        with open("/proc/stat") as fh:
            for line in fh:
                if line.startswith("cpu") and line[3].isdigit():
                    f = [int(x) for x in line.split()[1:]]
                    out.append(sum(f) - f[3] - f[4])          # busy jiffies (not idle, not iowait)
        return out

    def _tree_switches(self) -> int:
        """Context switches of every thread of the client tree (psutil's count is the main thread's only)."""
        total = 0
        for pid in list(self._seen):
            n = 0
            try:
                for task in Path(f"/proc/{pid}/task").iterdir():
                    for line in (task / "status").read_text().splitlines():
                        if "ctxt_switches:" in line:
                            n += int(line.split()[1])
                self._last_sw[pid] = max(n, self._last_sw.get(pid, 0))
            except OSError:
                pass
            total += self._last_sw.get(pid, 0)
        return total

    def _tree_cpu(self) -> float:
        if self.client is None:
            return 0.0
        try:
            for p in [self.client, *self.client.children(recursive=True)]:
                self._seen.setdefault(p.pid, p)
        except psutil.Error:
            pass
        total = 0.0
        for pid, p in list(self._seen.items()):
            try:
                t = p.cpu_times()
                total += t.user + t.system
                self._last[pid] = t.user + t.system
            except psutil.Error:
                total += self._last.get(pid, 0.0)       # exited: its last reading stands
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            st = self.server.cpu_times()
            own = psutil.Process().cpu_times()
            self.samples.append({"mono_ns": time.monotonic_ns(), "server_cpu": st.user + st.system,
                                 "client_cpu": self._tree_cpu(), "client_switches": self._tree_switches(),
                                 "self_cpu": own.user + own.system,
                                 "cores": self.cores()})
            self._stop.wait(0.25)

    def start(self, client_pid: int) -> None:
        self.client = psutil.Process(client_pid)
        self._last: dict[int, float] = {}
        self._last_sw: dict[int, int] = {}
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


# ------------------------------------------------------------------------------------------ clients
def client_command(name: str, args: argparse.Namespace, url: str, n: int, rounds: int, work: Path) -> list[str]:
    total = n * (rounds + 1)
    if name == "engineroom":
        return [sys.executable, str(Path(__file__).resolve()), "--engineroom-client", "--url", url,
                "--streams", str(n), "--rounds", str(rounds), "--max-tokens", str(args.max_tokens),
                "--client-out", str(work / "engineroom.json")]
    if name in PROTOTYPES:
        return [sys.executable, str(Path(__file__).resolve()), "--async-prototype-client",
                {"async-prototype": "raw", "async-httpx-prototype": "httpx"}.get(name, "aiohttp"), "--url", url,
                "--streams", str(n), "--rounds", str(rounds), "--max-tokens", str(args.max_tokens),
                "--client-out", str(work / "engineroom.json")]
    if name == "aiperf":
        return [args.aiperf, "profile", "--model", "standin", "--url", url, "--endpoint-type", "chat",
                "--streaming", "--tokenizer", str(args.tokenizer_dir), "--concurrency", str(n),
                "--request-count", str(total), "--prompt-input-tokens-mean", str(PROMPT_TOKENS),
                "--prompt-input-tokens-stddev", "0", "--prompt-output-tokens-mean", str(args.max_tokens),
                "--prompt-output-tokens-stddev", "0", "--use-server-token-count", "--export-level", "raw",
                "--output-artifact-dir", str(work / "aiperf"), "--ui", "none", "--no-server-metrics",
                "--no-gpu-telemetry", "--request-timeout-seconds", "600"]
    if name == "guidellm":
        return [args.guidellm, "run", "--backend", f"kind=openai_http,target={url}",
                "--profile", f"kind=concurrent,streams={n}",
                "--constraint", f"kind=max_requests,count={total}",
                "--data", f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},output_tokens={args.max_tokens}",
                "--tokenizer", f"kind=huggingface_auto,model={args.tokenizer_dir}",
                "--output", f"kind=json,path={work / 'guidellm.json'}", "--disable-progress"]
    raise ValueError(name)


def _sid(chunk_id: str | None) -> int | None:
    if chunk_id and chunk_id.startswith("chatcmpl-standin-"):
        return int(chunk_id.rsplit("-", 1)[1])
    return None


def client_requests(name: str, work: Path, server: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each request the client recorded: the server stream it was, its token times (ns) and which clock."""
    out: list[dict[str, Any]] = []
    extra: dict[str, Any] = {}
    if name in ("engineroom", *PROTOTYPES):
        data = json.loads((work / "engineroom.json").read_text())
        by_key = {s["key"]: s["sid"] for s in server["stream_log"]}
        for r in data["requests"]:
            out.append({"sid": r["sid"] if "sid" in r else by_key.get(r["key"]), "clock": "mono",
                        "tokens_ns": r["tokens_ns"], "index": None, "ok": r["status"] == 200})
        extra = {"engineroom_summary": data["summary"]} if "summary" in data else {}
    elif name == "aiperf":
        path = work / "aiperf" / "profile_export_raw.jsonl"
        with open(path) as fh:
            for line in fh:
                rec = json.loads(line)
                sid, times = None, []
                for resp in rec.get("responses") or []:
                    for packet in resp.get("packets") or []:
                        if packet.get("name") != "data" or packet.get("value", "").strip() == "[DONE]":
                            continue
                        chunk = json.loads(packet["value"])
                        sid = sid if sid is not None else _sid(chunk.get("id"))
                        choices = chunk.get("choices") or []
                        if choices and (choices[0].get("delta") or {}).get("content"):
                            times.append(resp["perf_ns"])
                out.append({"sid": sid, "clock": "mono", "tokens_ns": times, "index": None,
                            "ok": rec.get("status") == 200})
        summary = json.loads((work / "aiperf" / "profile_export_aiperf.json").read_text())
        extra = {"aiperf_output_tps": (summary.get("output_token_throughput") or {}).get("avg")}
    elif name == "guidellm":
        data = json.loads((work / "guidellm.json").read_text())
        bench = data["benchmarks"][0]
        reqs = bench["requests"]
        for status in ("successful", "errored", "incomplete"):
            for r in reqs.get(status) or []:
                t = r["info"]["timings"]
                first, last = t.get("first_token_iteration"), t.get("last_token_iteration")
                n = t.get("token_iterations") or 0
                times = [round(first * 1e9)] if first else []
                if last and n > 1:
                    times.append(round(last * 1e9))
                out.append({"sid": _sid(r.get("response_id")), "clock": "wall", "tokens_ns": times,
                            "index": [0, n - 1] if n > 1 else [0], "ok": status == "successful",
                            "iterations": n})
        tput = ((bench.get("metrics") or {}).get("output_tokens_per_second") or {}).get("successful") or {}
        extra = {"guidellm_output_tps": tput.get("mean"), "guidellm_kept_requests":
                 sum(len(reqs.get(s) or []) for s in ("successful", "errored", "incomplete"))}
    return out, extra


# ------------------------------------------------------------------------------------------ figures
def _q(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    return xs[min(len(xs) - 1, max(0, math.ceil(p / 100 * len(xs)) - 1))]


def figures(name: str, server: dict[str, Any], reqs: list[dict[str, Any]], samples: list[dict[str, Any]],
            n: int, rate: float, server_core: int = 0, client_core: int = 1) -> dict[str, Any]:
    logs = {s["sid"]: s for s in server["stream_log"]}
    sends = sorted(t for s in server["stream_log"] for t in s["mono_ns"])
    t0, t1 = sends[0], sends[-1]
    span = t1 - t0
    w0, w1 = t0 + 0.1 * span, t1 - 0.1 * span
    wsec = (w1 - w0) / 1e9
    sent_in = sum(1 for t in sends if w0 <= t <= w1)
    opens = server["open_samples"]
    held = [opens[i + 1] for i in range(0, len(opens), 2) if w0 <= opens[i] <= w1]
    errors: list[float] = []
    first_err: list[float] = []
    last_err: list[float] = []
    recv_in = 0
    matched = mismatched = unmatched = 0
    # the client's monotonic arrivals, placed on the window (wall-clock clients via the server's own pairing)
    wall_to_mono = statistics.median(s["mono_ns"][0] - s["wall_ns"][0] for s in server["stream_log"] if s["mono_ns"])
    for r in reqs:
        log = logs.get(r["sid"])
        if log is None:
            unmatched += 1
            continue
        sent = log["mono_ns"] if r["clock"] == "mono" else log["wall_ns"]
        idx = r["index"] if r["index"] is not None else list(range(len(r["tokens_ns"])))
        if r["index"] is None and len(r["tokens_ns"]) != log["sent"]:
            mismatched += 1
        else:
            matched += 1
        for i, t in zip(idx, r["tokens_ns"], strict=False):
            if i >= len(sent):
                continue
            e = (t - sent[i]) / 1e6
            errors.append(e)
            if i == 0:
                first_err.append(e)
            elif i == len(sent) - 1:
                last_err.append(e)
        mono = r["tokens_ns"] if r["clock"] == "mono" else [t + wall_to_mono for t in r["tokens_ns"]]
        if r["index"] is None:
            recv_in += sum(1 for t in mono if w0 <= t <= w1)
    errors.sort()
    first_err.sort()
    last_err.sort()
    win = [s for s in samples if w0 <= s["mono_ns"] <= w1]
    cpu = {}
    if len(win) >= 2:
        dt = (win[-1]["mono_ns"] - win[0]["mono_ns"]) / 1e9
        cores = [(b - a) / 100 / dt for a, b in zip(win[0]["cores"], win[-1]["cores"], strict=True)]   # USER_HZ 100
        ours = sum(win[-1][k] - win[0][k] for k in ("server_cpu", "client_cpu", "self_cpu")) / dt
        use = {k: (win[-1][k] - win[0][k]) / dt for k in ("server_cpu", "client_cpu", "self_cpu")}
        switches = win[-1]["client_switches"] - win[0]["client_switches"]
        cpu = {"server_cores": use["server_cpu"], "client_cores": use["client_cpu"],
               "client_switches_per_s": switches / dt,
               "machine_busy_per_core": [round(c, 3) for c in cores],
               "others_cores": max(0.0, sum(cores) - ours),
               # pinned: the stand-in and this script on server_core, the client on client_core
               "others_on_client_core": max(0.0, cores[client_core] - use["client_cpu"]),
               "others_on_server_core": max(0.0, cores[server_core] - use["server_cpu"] - use["self_cpu"])}
    stream_rates = sorted((s["sent"] - 1) / ((s["mono_ns"][-1] - s["mono_ns"][0]) / 1e9)
                          for s in server["stream_log"] if s["sent"] > 1 and s["mono_ns"][-1] > s["mono_ns"][0])
    ok = sum(1 for r in reqs if r["ok"])
    row = {
        "client": name, "streams": n, "rate_per_stream": rate, "asked_tok_s": n * rate,
        "window_s": round(wsec, 3), "requests_recorded": len(reqs), "requests_ok": ok,
        "server_requests": server["requests"], "matched": matched, "token_count_mismatch": mismatched,
        "unmatched": unmatched,
        "held_mean": statistics.fmean(held) if held else None, "held_min": min(held) if held else None,
        "held_max_overall": server["max_open"],
        "server_tok_s": sent_in / wsec if wsec > 0 else None,
        "client_tok_s": recv_in / wsec if wsec > 0 and name != "guidellm" else None,
        "server_stream_rate_p50": _q(stream_rates, 50), "server_stream_rate_p1": _q(stream_rates, 1),
        "server_send_late_ms": server["send_late_ms"], "server_cpu_s": server["cpu_s"],
        "server_wall_s": server["wall_s"], "held_back_bytes": server["held_back_bytes"],
        "errors_n": len(errors),
        "error_ms": {f"p{p:g}": _q(errors, p) for p in (1, 10, 50, 90, 99, 99.9)}
        | {"max": errors[-1] if errors else None},
        "first_token_error_ms": {f"p{p}": _q(first_err, p) for p in (50, 99)},
        "last_token_error_ms": {f"p{p}": _q(last_err, p) for p in (50, 99)},
        "cpu": cpu,
    }
    if cpu and row["client_tok_s" if name != "guidellm" else "server_tok_s"]:
        tps = row["client_tok_s" if name != "guidellm" else "server_tok_s"]
        row["client_us_per_token"] = cpu["client_cores"] / tps * 1e6
        row["client_switches_per_token"] = cpu["client_switches_per_s"] / tps
    return row


# ------------------------------------------------------------------------------------------ the run
def wait_quiet(core: int, limit: float, max_wait_s: float) -> tuple[float, float]:
    """Wait (at most max_wait_s) until the client's core is busier than ``limit`` for no whole second
    (other work on this shared machine); returns the seconds waited and the last second's busy share."""
    t0 = time.monotonic()
    while True:
        a = Sampler.cores()[core]
        time.sleep(1.0)
        busy = (Sampler.cores()[core] - a) / 100
        if busy <= limit or time.monotonic() - t0 >= max_wait_s:
            return round(time.monotonic() - t0, 1), round(busy, 3)


def run_one(name: str, args: argparse.Namespace, url: str, server_pid: int, n: int, rate: float,
            label: str) -> dict[str, Any]:
    per_request_s = args.max_tokens / rate + FIRST_MS / 1000
    rounds = max(2, math.ceil(args.seconds / per_request_s))
    waited, before = wait_quiet(args.client_core, args.quiet_load, args.quiet_wait_s)
    work = Path(tempfile.mkdtemp(prefix=f"ceiling-{name}-"))
    _post(f"{url}/standin/phase", {"rate": rate, "first_ms": FIRST_MS, "label": label})
    sampler = Sampler(server_pid)
    cmd = ["taskset", "-c", str(args.client_core), *client_command(name, args, url, n, rounds, work)]
    # no HF_HUB_OFFLINE: aiperf 0.13.0 then resolves even a local folder through the hub cache and fails;
    # the folder loads locally without it (the hub is not reachable, and is not asked)
    env = dict(os.environ)
    t0 = time.monotonic()
    with open(work / "client.log", "w") as log:
        # its own session, so an interrupted run can end the client's whole tree (guidellm and aiperf spawn workers)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=work, env=env, start_new_session=True)
        sampler.start(proc.pid)
        try:
            rc = proc.wait(timeout=args.client_timeout)
        except BaseException:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
            raise
        finally:
            sampler.stop()
    elapsed = time.monotonic() - t0
    dump = work / "server.json"
    _post(f"{url}/standin/dump", {"path": str(dump)})
    server = json.loads(dump.read_text())
    if rc != 0:
        tail = (work / "client.log").read_text()[-2000:]
        print(f"  {name}: exit {rc}\n{tail}", file=sys.stderr)
        return {"client": name, "streams": n, "rate_per_stream": rate, "label": label, "rc": rc, "error": tail[-400:]}
    reqs, extra = client_requests(name, work, server)
    row = figures(name, server, reqs, sampler.samples, n, rate, args.server_core, args.client_core)
    row.update(label=label, rc=rc, rounds=rounds, run_s=round(elapsed, 1), quiet_waited_s=waited,
               client_core_busy_before=before, **extra)
    row["open_samples_s"] = [[round((server["open_samples"][i] - server["open_samples"][0]) / 1e9, 2),
                              server["open_samples"][i + 1]] for i in range(0, len(server["open_samples"]), 10)]
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        row["work_dir"] = str(work)
    return row


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    from hf_tokenizer import default_gguf, write_tokenizer_folder

    args.tokenizer_dir = write_tokenizer_folder(args.gguf or default_gguf(), args.tokenizer_dir)
    url = f"http://127.0.0.1:{args.port}"
    proc = start_standin(args.port, args.server_core, args.standin_realtime)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))      # so the finally below stops the stand-in
    os.sched_setaffinity(0, {args.server_core})        # this script's sampling stays off the client's core
    rows: list[dict[str, Any]] = []
    try:
        order = list(args.clients)
        cells = ([(int(c.split(":")[0]), float(c.split(":")[1])) for c in args.cells] if args.cells
                 else [(n, rate) for rate in args.rates for n in args.streams])
        for rep in range(args.reps):
            for n, rate in cells:
                for name in order:
                    label = f"rep{rep} N={n} r={rate:g} {name}"
                    print(f"{label} ...", flush=True)
                    row = run_one(name, args, url, proc.pid, n, rate, label)
                    row["rep"] = rep
                    rows.append(row)
                    if row.get("rc") == 0:
                        print("  " + brief(row), flush=True)
                order = order[1:] + order[:1]          # rotate who goes first
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return rows


# ------------------------------------------------------------------------------------------ tables
def _f(x: Any, fmt: str = ",.0f") -> str:
    return "n/a" if x is None else format(x, fmt)


def brief(r: dict[str, Any]) -> str:
    return (f"held {_f(r['held_mean'], '.0f')}, server {_f(r['server_tok_s'])} tok/s, client "
            f"{_f(r['client_tok_s'])} tok/s, error p50 {_f(r['error_ms']['p50'], '.3f')} ms p99 "
            f"{_f(r['error_ms']['p99'], '.2f')} ms, client CPU {_f(r['cpu'].get('client_cores'), '.2f')}, server CPU "
            f"{_f(r['cpu'].get('server_cores'), '.2f')}, run {r['run_s']} s")


def tables(rows: list[dict[str, Any]]) -> list[str]:
    ok = [r for r in rows if r.get("rc") == 0]
    out = ["### Every run (in the order run)", "",
           "| run | asked tok/s | streams held (mean in window / max) | server sent tok/s | client received tok/s | "
           "error p50 ms | error p99 ms | error max ms | first-token error p50 / p99 ms | client CPU (cores) | "
           "stand-in CPU (cores) | stand-in send late p50 / p99 ms | other work on client / stand-in core |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r.get("rc") != 0:
            out.append(f"| {r['label']} | {r['streams'] * r['rate_per_stream']:,.0f} | failed: exit {r.get('rc')} |"
                       + " |" * 10)
            continue
        late = r["server_send_late_ms"]
        out.append(
            f"| {r['label']} | {r['asked_tok_s']:,.0f} | {_f(r['held_mean'], '.1f')} / {r['held_max_overall']} | "
            f"{_f(r['server_tok_s'])} | {_f(r['client_tok_s'])} | {_f(r['error_ms']['p50'], '.3f')} | "
            f"{_f(r['error_ms']['p99'], '.2f')} | {_f(r['error_ms']['max'], '.1f')} | "
            f"{_f(r['first_token_error_ms']['p50'], '.2f')} / {_f(r['first_token_error_ms']['p99'], '.2f')} | "
            f"{_f(r['cpu'].get('client_cores'), '.2f')} | {_f(r['cpu'].get('server_cores'), '.2f')} | "
            f"{_f(late['p50'], '.2f')} / {_f(late['p99'], '.2f')} | "
            f"{_f(r['cpu'].get('others_on_client_core'), '.2f')} / "
            f"{_f(r['cpu'].get('others_on_server_core'), '.2f')} |")
    out += ["", "### Per client and cell (median over repetitions)", "",
            "| client | streams | asked tok/s | held (mean) | server sent tok/s | client received tok/s | "
            "error p50 ms | error p99 ms | client CPU | runs |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    cells = sorted({(r["client"], r["streams"], r["rate_per_stream"]) for r in ok},
                   key=lambda c: (c[1], c[2], CLIENTS.index(c[0]) if c[0] in CLIENTS else 9))

    def med(rs: list[dict[str, Any]], f: Any) -> float | None:
        vals = [f(r) for r in rs if f(r) is not None]
        return statistics.median(vals) if vals else None

    for c in cells:
        rs = [r for r in ok if (r["client"], r["streams"], r["rate_per_stream"]) == c]
        out.append(f"| {c[0]} | {c[1]} | {c[1] * c[2]:,.0f} | {_f(med(rs, lambda r: r['held_mean']), '.1f')} | "
                   f"{_f(med(rs, lambda r: r['server_tok_s']))} | {_f(med(rs, lambda r: r['client_tok_s']))} | "
                   f"{_f(med(rs, lambda r: r['error_ms']['p50']), '.3f')} | "
                   f"{_f(med(rs, lambda r: r['error_ms']['p99']), '.2f')} | "
                   f"{_f(med(rs, lambda r: r['cpu'].get('client_cores')), '.2f')} | {len(rs)} |")
    out += ["", "### Ceiling per client (best cell: the highest server-sent rate over the window)", "",
            "| client | ceiling tok/s (sent to it) | at asked | streams held | error p50 / p99 ms there | "
            "vs 25,000 tok/s | vs 256 streams | vs 0.5 ms median |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    best: dict[str, dict[str, Any]] = {}
    for name in (*CLIENTS, *PROTOTYPES):
        rs = [r for r in ok if r["client"] == name and r["server_tok_s"]]
        if not rs:
            continue
        b = max(rs, key=lambda r: r["server_tok_s"])
        best[name] = b
        out.append(f"| {name} | {b['server_tok_s']:,.0f} | {b['asked_tok_s']:,.0f} | {_f(b['held_mean'], '.1f')} | "
                   f"{_f(b['error_ms']['p50'], '.3f')} / {_f(b['error_ms']['p99'], '.2f')} | "
                   f"{b['server_tok_s'] / TARGETS['tok_s']:.2f}x | {(b['held_mean'] or 0) / TARGETS['streams']:.2f}x | "
                   f"{'met' if (b['error_ms']['p50'] or 9e9) <= TARGETS['median_error_ms'] else 'missed'} |")
    if "engineroom" in best and any(k in best for k in ("aiperf", "guidellm")):
        tool = max((k for k in ("aiperf", "guidellm") if k in best), key=lambda k: best[k]["server_tok_s"])
        ratio = best["engineroom"]["server_tok_s"] / best[tool]["server_tok_s"]
        e_er, e_tool = best["engineroom"]["error_ms"]["p50"], best[tool]["error_ms"]["p50"]
        out += ["", f"Bar: engineroom's ceiling / the better tool's ({tool}) = **{ratio:.2f}x** "
                    f"(bar >= 1.0x); median error {e_er:.3f} ms vs {e_tool:.3f} ms "
                    f"({'equal or better' if e_er <= e_tool else 'worse'})."]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, nargs="+", default=[256])
    ap.add_argument("--rates", type=float, nargs="+", default=[50, 100, 200], help="tokens/s per stream")
    ap.add_argument("--cells", nargs="+", metavar="N:RATE",
                    help="streams:tokens/s-per-stream pairs (instead of the --streams x --rates product)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=10.0, help="about how long each run streams")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--clients", nargs="+", default=list(CLIENTS), choices=[*CLIENTS, *PROTOTYPES])
    ap.add_argument("--port", type=int, default=8399)
    ap.add_argument("--server-core", type=int, default=0)
    ap.add_argument("--client-core", type=int, default=1)
    ap.add_argument("--aiperf", default="/tmp/aiperf-venv/bin/aiperf")
    ap.add_argument("--guidellm", default="/tmp/guidellm-venv/bin/guidellm")
    ap.add_argument("--gguf", type=Path, help="GGUF whose vocabulary makes the tools' tokenizer (default: SmolLM2)")
    ap.add_argument("--tokenizer-dir", type=Path, default=Path(tempfile.gettempdir()) / "engineroom-smollm2-tokenizer")
    ap.add_argument("--client-timeout", type=float, default=300)
    ap.add_argument("--no-standin-realtime", dest="standin_realtime", action="store_false",
                    help="run the stand-in at normal priority (default: chrt -f 1 on its core)")
    ap.add_argument("--quiet-load", type=float, default=0.25,
                    help="before each run, wait for the client core's other load to drop to this share")
    ap.add_argument("--quiet-wait-s", type=float, default=20, help="... for at most this long")
    ap.add_argument("--keep", action="store_true", help="keep each run's work folder (tool outputs, logs)")
    ap.add_argument("--out-json", type=Path)
    ap.add_argument("--report", type=Path, help="re-print the tables from a stored --out-json file")
    # internal: the engineroom client, run pinned in a subprocess
    ap.add_argument("--engineroom-client", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--async-prototype-client", choices=["raw", "httpx", "aiohttp"], help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--client-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.engineroom_client:
        engineroom_client(args.url, args.streams[0], args.rounds, args.max_tokens, args.client_out)
        return 0
    if args.async_prototype_client:
        async_prototype_client(args.url, args.streams[0], args.rounds, args.max_tokens, args.client_out,
                               args.async_prototype_client)
        return 0
    if args.report:
        data = json.loads(args.report.read_text())
        print("\n".join(tables(data["rows"])))
        return 0
    t0 = time.time()
    load0 = os.getloadavg()
    rows = measure(args)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "python": platform.python_version(),
            "machine": platform.machine(), "cpu_count": os.cpu_count(), "seconds": round(time.time() - t0, 1),
            "argv": sys.argv[1:], "loadavg_before": load0, "loadavg_after": os.getloadavg(),
            "server_core": args.server_core, "client_core": args.client_core, "prompt_tokens": PROMPT_TOKENS,
            "first_ms": FIRST_MS, "targets": TARGETS}
    if args.out_json:
        args.out_json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print("\n".join(tables(rows)))
    print(f"({meta['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
