"""The client's own side of a measurement: which token chunks were reasoning, and whether the
client itself was the bottleneck.

``KindClient`` is ``client.OpenAIClient`` that also notes, for every token chunk it times,
whether it carried reasoning or content text (``token_kinds``: "r" / "c"), so time to first
token and time to first *content* token, and reasoning vs content chunk counts, can be
recomputed from the record (``encode_kinds``: run-length, ``[["r", 120], ["c", 40]]``).

``ClientMonitor`` runs beside a bench: it records this process's CPU time over the wall time
(``time.process_time``: every thread of the client) and the lag of a probe thread that asks to
wake every ``interval_s`` (how late each wake-up was, integer µs). A client that saturates its
core or its interpreter shows both: its CPU share near one core and wake-ups tens of
milliseconds late — and then its timestamps are late too. Where the streams run on one event
loop (``suites.streams``), the loop's own lag is recorded too (``loop_lags_us``). The raw lags are
stored (a ``client_load`` record); ``integrity`` judges them.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from engineroom.client import OpenAIClient, StreamResult

__all__ = ["ClientMonitor", "KindClient", "decode_kinds", "encode_kinds"]


class KindClient(OpenAIClient):
    """OpenAIClient whose stream results also carry ``token_kinds`` (one "r"/"c" per token chunk)."""

    @staticmethod
    def _absorb(result: StreamResult, tools: Any, event: str, data: str, now: float) -> None:
        before_c, before_r, before_n = len(result.content), len(result.reasoning), len(result.token_times)
        OpenAIClient._absorb(result, tools, event, data, now)
        if len(result.token_times) > before_n:
            kinds: list[str] = result.__dict__.setdefault("token_kinds", [])
            # a chunk with both reasoning and content text counts as content (it ends the thinking)
            kinds.append("c" if len(result.content) > before_c else "r" if len(result.reasoning) > before_r else "c")


def encode_kinds(kinds: Sequence[str]) -> list[list[Any]]:
    out: list[list[Any]] = []
    for k in kinds:
        if out and out[-1][0] == k:
            out[-1][1] += 1
        else:
            out.append([k, 1])
    return out


def decode_kinds(runs: Any) -> list[str] | None:
    if not isinstance(runs, list):
        return None
    out: list[str] = []
    for item in runs:
        if isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[1], int):
            out.extend([str(item[0])] * item[1])
    return out


def _task_schedstat() -> dict[int, tuple[int, int, int]] | None:
    """Per thread of this process: (ns on a CPU, ns runnable but waiting on a run queue, times
    run), from Linux's /proc/self/task/*/schedstat; None where the OS does not give it."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    out: dict[int, tuple[int, int, int]] = {}
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                on_cpu, waited, slices = (int(x) for x in f.read().split()[:3])
        except (OSError, ValueError):
            continue             # the thread ended between the listing and the read
        out[int(tid)] = (on_cpu, waited, slices)
    return out or None


class ClientMonitor:
    """CPU time, wake-up lag and run-queue wait of this process while a bench runs (a context manager).

    The run-queue wait catches what the other two miss: a client whose stream threads are ready
    but not running (a shared, oversubscribed core) reads its tokens late while its CPU share stays
    low and a lone probe thread still wakes on time. It is summed over every thread seen (sampled
    every ``schedstat_every_s``, so threads that end mid-run are counted up to their last sample)."""

    def __init__(self, interval_s: float = 0.005, schedstat_every_s: float = 0.2) -> None:
        self.interval_s = interval_s
        self.schedstat_every_s = schedstat_every_s
        self.lags_us: list[int] = []
        # how late the multi-stream event loop ran a callback it asked for every LOOP_PROBE_S
        # (``suites.streams.StreamDriver`` appends here while it runs): a late loop reads every stream late
        self.loop_lags_us: list[int] = []
        self.loop_interval_s = 0.005
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._probe, name="engineroom-lag-probe", daemon=True)
        self.cpu_s = 0.0
        self.wall_s = 0.0
        self._sched0: dict[int, tuple[int, int, int]] | None = None
        self._sched: dict[int, tuple[int, int, int]] = {}

    def _sample_sched(self) -> None:
        now = _task_schedstat()
        if now is not None:
            self._sched.update(now)

    def _probe(self) -> None:
        next_sched = time.perf_counter()
        while not self._stop.is_set():
            t0 = time.perf_counter()
            time.sleep(self.interval_s)
            self.lags_us.append(max(0, round((time.perf_counter() - t0 - self.interval_s) * 1e6)))
            if self._sched0 is not None and t0 >= next_sched:
                self._sample_sched()
                next_sched = t0 + self.schedstat_every_s

    def _runqueue(self) -> dict[str, Any]:
        if self._sched0 is None:
            return {"runq_wait_s": None, "runq_slices": None, "threads_seen": None}
        base = self._sched0
        waited = sum(w - base.get(tid, (0, 0, 0))[1] for tid, (_, w, _n) in self._sched.items())
        slices = sum(n - base.get(tid, (0, 0, 0))[2] for tid, (_, _w, n) in self._sched.items())
        return {"runq_wait_s": max(0, waited) / 1e9, "runq_slices": max(0, slices), "threads_seen": len(self._sched)}

    def __enter__(self) -> ClientMonitor:
        self._cpu0, self._wall0 = time.process_time(), time.perf_counter()
        self._sched0 = _task_schedstat()
        if self._sched0 is not None:
            self._sched = dict(self._sched0)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._sample_sched()
        self.cpu_s = time.process_time() - self._cpu0
        self.wall_s = time.perf_counter() - self._wall0

    def record(self) -> dict[str, Any]:
        """The raw figures, as stored (``client_load`` record payload)."""
        out = {"cpu_s": self.cpu_s, "wall_s": self.wall_s, "interval_us": round(self.interval_s * 1e6),
               "lags_us": list(self.lags_us), **self._runqueue()}
        if self.loop_lags_us:
            out.update(loop_interval_us=round(self.loop_interval_s * 1e6), loop_lags_us=list(self.loop_lags_us))
        return out
