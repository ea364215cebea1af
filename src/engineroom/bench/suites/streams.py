"""Every stream of a multi-stream suite (``concurrency``, ``sweep``, ``rate``) on one event loop.

Each of those suites' folder holds its own run (``concurrency.run``, ``sweep.run``, ``rate.run``);
they share the ``StreamDriver``, ``submit`` (one request, its record made when it is answered) and
``run_round`` (N simultaneous streams on salted prompts, one scheduled send).

Why: with one thread and one ``httpx.Client`` per stream, 256 streams on one core spent their time
in thread wake-ups and GIL hand-offs (about two context switches per token), so tokens were read
hundreds of milliseconds after they arrived (``benchmarks/client_ceiling.md``). Here one asyncio
loop, in a thread of its own, reads every stream; the calling thread only sizes prompts, submits
requests and turns results into records (``suites.request.request_record``, the same records as the
sequential suites store: ``runner.measure_request`` with the engine's timings normalised by its
adapter, ``arrivals_us``, ``arrival_kinds``, ``scheduled_lag_us``).

The HTTP layer is aiohttp (its C HTTP parser): measured against a raw ``asyncio.Protocol`` reader
at 256 streams x 100 tok/s on this 2-core machine it cost 19.6-20.1 us of CPU per token against
16.3-18.4 us, with the same timing error (``benchmarks/data/client_ceiling_http_layer.json``), and
it brings https, keep-alive, chunked and sized bodies and the proxy environment with it. Loopback
never goes through a proxy (``net.is_loopback``, as every other client of engineroom).

Per stream the parsing is ``client.py``'s: ``SSEFeed`` frames events with ``_sse_events``'s rules,
``take_event`` / the client class's ``_absorb`` fold each into a ``StreamResult``. Every event is
stamped with ``time.perf_counter()`` taken when the read that brought its bytes returned.

A client that is not an ``OpenAIClient`` (a test's stand-in object with ``stream_chat``) is driven
through the same scheduling, each call in a worker thread of its own.

``StreamDriver`` also probes its own loop: a callback asked every ``LOOP_PROBE_S`` records how late
it ran (``ClientMonitor.loop_lags_us``); a late loop reads every stream late, and
``integrity.client_not_bottleneck`` judges it.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import aiohttp

from engineroom import net
from engineroom.bench.clientside import ClientMonitor
from engineroom.bench.runner import StreamingClient
from engineroom.bench.suites.context import SuiteContext
from engineroom.bench.suites.haystack import haystack
from engineroom.bench.suites.request import request_record, suite_payload
from engineroom.bench.suites.specs import SuiteSpec
from engineroom.bench.workloads import Workload
from engineroom.client import (
    OpenAIClient,
    SSEFeed,
    StreamResult,
    ToolCallAssembler,
    error_message,
    finish_stream,
    stream_body,
    take_event,
)

__all__ = ["LOOP_PROBE_S", "SCHEDULE_AHEAD_S", "Sent", "StreamDriver", "run_round", "submit"]

SCHEDULE_AHEAD_S = 0.05      # a round's streams are scheduled this far ahead, so every stream is waiting
LOOP_PROBE_S = 0.005


@dataclass
class Sent:
    """One request as the driver sent it: its result (None when a stand-in client raised ``error``)."""

    result: Any
    sent_unix: float
    t0: float
    t_done: float
    error: BaseException | None = None


class StreamDriver:
    """Up to ``width`` streams at once from one event loop; ``submit`` from any other thread."""

    def __init__(self, new_client: Callable[[], StreamingClient], width: int, timeout_s: float,
                 monitor: ClientMonitor | None = None) -> None:
        first = new_client()
        self.width, self.timeout_s = max(1, width), float(timeout_s)
        self.stall_s: float | None = None      # the watchdog's limit for the next sends (no byte for that long)
        self.loop_lags_us: list[int] = monitor.loop_lags_us if monitor is not None else []
        if monitor is not None:
            monitor.loop_interval_s = LOOP_PROBE_S
        self._http: aiohttp.ClientSession | None = None
        self._clients: list[StreamingClient] = []
        self._pool: ThreadPoolExecutor | None = None
        if isinstance(first, OpenAIClient):
            self.url = f"{first.base_url}/v1/chat/completions"
            self._absorb = type(first)._absorb              # KindClient's: token kinds too
            self._headers = {"Accept": "text/event-stream", "Content-Type": "application/json"}
            if first.api_key:
                self._headers["Authorization"] = f"Bearer {first.api_key}"
            self._trust_env = not net.is_loopback(first.base_url)
            first.close()
        else:
            self._clients = [first] + [new_client() for _ in range(self.width - 1)]
            self._pool = ThreadPoolExecutor(max_workers=self.width, thread_name_prefix="engineroom-stream")
        self._loop = asyncio.new_event_loop()
        self._gate = asyncio.Semaphore(self.width)
        self._due = 0.0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engineroom-streams", daemon=True)
        self._thread.start()
        self._ready.wait()

    # -- the loop's thread ----------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        if self._pool is None:
            self._loop.run_until_complete(self._open())
        self._loop.call_soon(self._probe)
        self._loop.call_soon(self._ready.set)
        self._loop.run_forever()

    async def _open(self) -> None:
        connector = aiohttp.TCPConnector(limit=self.width, limit_per_host=0)
        self._http = aiohttp.ClientSession(connector=connector, trust_env=self._trust_env)

    def _probe(self) -> None:
        now = time.perf_counter()
        if self._due:
            self.loop_lags_us.append(max(0, round((now - self._due) * 1e6)))
        self._due = now + LOOP_PROBE_S
        self._loop.call_later(LOOP_PROBE_S, self._probe)

    async def _send(self, payload: dict[str, Any], t_scheduled: float | None) -> Sent:
        async with self._gate:
            while t_scheduled is not None and time.perf_counter() < t_scheduled:   # never before its time
                await asyncio.sleep(t_scheduled - time.perf_counter())
            sent_unix, t0 = time.time(), time.perf_counter()
            if self._pool is None:
                result = await self._stream(payload, self.timeout_s, self.stall_s)
                return Sent(result, sent_unix, t0, time.perf_counter())
            client = self._clients.pop()
            try:
                result = await self._loop.run_in_executor(self._pool, client.stream_chat, payload, self.timeout_s)
                return Sent(result, sent_unix, t0, time.perf_counter())
            except Exception as exc:  # noqa: BLE001 - a client's failure becomes a failed request record
                return Sent(None, sent_unix, t0, time.perf_counter(), exc)
            finally:
                self._clients.append(client)

    async def _stream(self, payload: dict[str, Any], limit: float, stall_s: float | None = None) -> StreamResult:
        """``OpenAIClient.stream_chat`` on this loop: same body, same bookkeeping, same errors."""
        assert self._http is not None
        body = json.dumps(stream_body(payload)).encode()
        result, tools, feed = StreamResult(), ToolCallAssembler(), SSEFeed()
        read = min(limit, stall_s) if stall_s else limit
        timeout = aiohttp.ClientTimeout(total=None, connect=min(limit, 10.0), sock_read=read)
        result.t_request = time.perf_counter()
        deadline = result.t_request + limit
        try:
            async with self._http.post(self.url, data=body, headers=self._headers, timeout=timeout) as response:
                result.status = response.status
                if response.status != 200:
                    result.error = f"HTTP {response.status}: {error_message(await response.read())}"
                    return result
                stop = False
                while not stop:
                    data = await response.content.readany()
                    now = time.perf_counter()               # the read that brought these events
                    for event, text in (feed.feed(data) if data else feed.close()):
                        if take_event(result, tools, event, text, now, self._absorb):
                            stop = True
                            break
                        if now > deadline:
                            result.error = result.error or f"stream still running after {limit:g} s; cut off"
                            stop = True
                            break
                    if not data:
                        break
                result.t_end = time.perf_counter()
                if result.done and not response.content.at_eof():   # the body's tail, so the connection is kept
                    try:
                        await asyncio.wait_for(response.content.read(), timeout=min(limit, 5.0))
                    except (TimeoutError, aiohttp.ClientError):
                        pass
        except TimeoutError:
            result.error = (f"stalled: no data for {read:g} s after {result.chunks} chunks"
                            if result.status else f"no answer within {read:g} s")
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            where = f"stream broke after {result.chunks} chunks: " if result.status else ""
            result.error = f"{where}{type(exc).__name__}: {exc}"
        finally:
            if not result.t_end:
                result.t_end = time.perf_counter()
        return finish_stream(result, tools)

    async def _shutdown(self) -> None:
        me = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not me]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._http is not None:
            await self._http.close()

    # -- the caller's thread --------------------------------------------------------------------

    def submit(self, payload: dict[str, Any], t_scheduled: float | None = None) -> Future[Sent]:
        """Send ``payload`` streamed at ``t_scheduled`` (perf_counter), or now, once fewer than
        ``width`` streams are open; requests wait for a free stream in the order submitted."""
        return asyncio.run_coroutine_threadsafe(self._send(payload, t_scheduled), self._loop)

    def close(self) -> None:
        """Cancel whatever is still waiting or streaming, and end the loop."""
        if self._loop.is_closed():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            if not self._thread.is_alive():
                self._loop.close()
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> StreamDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- what the multi-stream suites share: one request submitted, one round of N streams ---------------


def submit(spec: SuiteSpec, ctx: SuiteContext, driver: StreamDriver, workload: Workload, *, index: int,
            warmup: bool, extra: Mapping[str, Any],
            t_scheduled: float) -> tuple[Future[Sent], Callable[[], dict[str, Any]]]:
    """Send one request; returns its future and what waits for it and makes its record."""
    payload, sent = suite_payload(spec, ctx, workload)
    fut = driver.submit(payload, t_scheduled)

    def record() -> dict[str, Any]:
        s = fut.result()
        return request_record(spec, ctx, workload, index=index, warmup=warmup, extra=extra, sent=sent,
                              sent_unix=s.sent_unix, t0=s.t0, t_done=s.t_done, result=s.result, error=s.error,
                              t_scheduled=t_scheduled)
    return fut, record


def run_round(spec: SuiteSpec, ctx: SuiteContext, driver: StreamDriver, n: int, tokens: int, *, round_no: int,
           index: int, warmup: bool, group: Mapping[str, Any]) -> None:
    """One round of ``n`` simultaneous streams on salted ``tokens``-token prompts, one scheduled send."""
    prompts = [haystack(ctx.salts(), tokens, ctx.count_tokens) for _ in range(n)]   # sized before the clock
    driver.stall_s = ctx.stall_limit(tokens * n)      # n prompts share the engine's prefill
    t_sched = time.perf_counter() + SCHEDULE_AHEAD_S
    waits = [submit(spec, ctx, driver, Workload(f"{spec.kind} N={n}", prompts[i].text, spec.max_tokens),
                     index=index, warmup=warmup, t_scheduled=t_sched,
                     extra={"group": dict(group), "round": round_no, "stream": i, "salt": prompts[i].salt,
                            "target_tokens": tokens, "counted_tokens": prompts[i].counted_tokens,
                            "sized_by": prompts[i].sized_by})
             for i in range(n)]
    for _, wait in waits:
        ctx.store("bench_request", wait())
