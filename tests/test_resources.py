"""resources: USS of a real process tree grows with what it allocates; the sampler's summary."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from engineroom.resources import ResourceSampler, gpu_memory, process_tree_memory, summarize_samples

_CHILD = (
    "import sys, time\n"
    "blocks = []\n"
    "for line in sys.stdin:\n"
    "    blocks.append(bytearray(int(line)))\n"   # bytearray(n) is zero-filled: its pages are touched
    "    print('ok', flush=True)\n"
)


def test_uss_of_a_process_tree_follows_what_it_allocates():
    # a parent whose child allocates: the tree's USS must count the child
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {_CHILD!r}])"
    proc = subprocess.Popen([sys.executable, "-c", parent],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdin is not None and proc.stdout is not None
        deadline = time.time() + 10
        while time.time() < deadline:
            before = process_tree_memory(proc.pid)
            if before and len(before["pids"]) == 2:
                break
            time.sleep(0.05)
        assert before is not None and len(before["pids"]) == 2, before
        if before["uss_bytes"] is None:
            pytest.skip("this OS does not give a process's unique set size")
        proc.stdin.write(f"{64 << 20}\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "ok"
        after = process_tree_memory(proc.pid)
        assert after is not None
        grown = after["uss_bytes"] - before["uss_bytes"]
        assert 60 << 20 <= grown <= 80 << 20, grown
        assert after["rss_bytes"] >= after["uss_bytes"]
    finally:
        proc.kill()
        proc.wait()
    assert process_tree_memory(proc.pid) is None      # gone: None, never zeros


_BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5:\n    pass\n"


def test_the_cpu_of_a_child_that_exited_stays_the_trees():
    """An engine's worker that exits between two samples: its CPU seconds stay the engine's (the
    parent's reaped-children times), not a drop that host_contention would read as another process."""
    parent = ("import subprocess, sys\n"
              f"subprocess.run([sys.executable, '-c', {_BURN!r}])\n"     # run() waits: the child is reaped
              "print('done', flush=True)\n"
              "sys.stdin.readline()\n")
    proc = subprocess.Popen([sys.executable, "-c", parent], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "done"
        tree = process_tree_memory(proc.pid)
        assert tree is not None and tree["pids"] == [proc.pid]       # the child is gone
        assert tree["cpu_s"] >= 0.45, tree                              # and its 0.5 s of CPU counted
    finally:
        proc.kill()
        proc.wait()


def test_sampler_records_idle_peak_after_and_the_engine_cpu():
    proc = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdin is not None and proc.stdout is not None
        with ResourceSampler(proc.pid, interval_s=0.05, gpus=False) as sampler:
            time.sleep(0.15)
            proc.stdin.write(f"{48 << 20}\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == "ok"
            time.sleep(0.15)
            proc.stdin.write("0\n")        # keep the 48 MiB; the last sample still holds it
            proc.stdin.flush()
            proc.stdout.readline()
    finally:
        proc.kill()
        proc.wait()
    rec = sampler.record()
    assert len(rec["samples"]) >= 4
    rss = rec["summary"]["engine_rss_bytes"]
    assert rss["peak"] - rss["idle"] >= 40 << 20
    assert rss["after"] == rss["peak"]
    assert rec["summary"]["host_ram_used_bytes"]["n"] == len(rec["samples"])
    assert "gpus" not in rec["samples"][0]          # gpus=False: not asked


def test_summary_of_recorded_samples_with_gpus():
    samples = [
        {"t": 0.0, "host": {"ram_used_bytes": 10, "cpu_pct": 1.0},
         "engine": {"uss_bytes": 5, "rss_bytes": 9, "cpu_s": 1.0},
         "gpus": [{"index": 0, "used_bytes": 100, "util_pct": 0}]},
        {"t": 2.0, "host": {"ram_used_bytes": 30, "cpu_pct": 90.0},
         "engine": {"uss_bytes": 8, "rss_bytes": 12, "cpu_s": 4.0},
         "gpus": [{"index": 0, "used_bytes": 400, "util_pct": 97}]},
        {"t": 4.0, "host": {"ram_used_bytes": 20, "cpu_pct": 5.0}, "engine": None,
         "gpus": [{"index": 0, "used_bytes": 300, "util_pct": None}]},
    ]
    s = summarize_samples(samples)
    assert s["gpu0_used_bytes"] == {"idle": 100.0, "peak": 400.0, "after": 300.0, "n": 3.0}
    assert s["gpu0_util_pct"]["n"] == 2.0          # None is not a reading
    assert s["engine_uss_bytes"]["after"] == 8.0    # the last reading that had the engine
    assert s["engine_cpu_s"] == {"total": 3.0, "wall_s": 2.0, "cores": 1.5}


def test_gpu_memory_is_none_without_a_driver_and_real_readings_with_one():
    gpus = gpu_memory()
    if not Path("/proc/driver/nvidia").exists():
        assert gpus is None          # no NVIDIA driver: None (the caller says "not measured"), never zeros
        return
    assert gpus and all(0 < g["used_bytes"] <= g["total_bytes"] for g in gpus)


def test_nvml_readings_through_one_session_each_shut_down(monkeypatch):
    """gpu_memory and gpu_memory_of on a fake NVML: the readings, and nvmlShutdown after each."""
    import sys
    import types

    from engineroom.resources import gpu_memory_of

    calls = []
    proc = types.SimpleNamespace
    fake = types.SimpleNamespace(
        NVMLError=RuntimeError,
        nvmlInit=lambda: calls.append("init"), nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: 2, nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetMemoryInfo=lambda h: proc(used=(h + 1) << 30, total=80 << 30),
        nvmlDeviceGetName=lambda h: b"NVIDIA H200",
        nvmlDeviceGetUtilizationRates=lambda h: proc(gpu=50 + h),
        nvmlDeviceGetComputeRunningProcesses=lambda h: [proc(pid=7, usedGpuMemory=1 << 20),
                                                        proc(pid=8, usedGpuMemory=None),
                                                        proc(pid=9, usedGpuMemory=5 << 20)] if h == 1 else [])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert gpu_memory() == [
        {"index": 0, "name": "NVIDIA H200", "used_bytes": 1 << 30, "total_bytes": 80 << 30, "util_pct": 50},
        {"index": 1, "name": "NVIDIA H200", "used_bytes": 2 << 30, "total_bytes": 80 << 30, "util_pct": 51}]
    assert gpu_memory_of({7, 8}) == {1: 1 << 20}          # only the given pids, GPUs they use
    assert calls == ["init", "shutdown", "init", "shutdown"]
