"""Which CPU instructions really run on this machine — not which ones the CPU claims.

A CPU's flags (``/proc/cpuinfo``) and the kernel's answer can both say yes while a
hypervisor traps the instruction: seen on a VM whose CPU lists ``amx_tile amx_int8`` and
whose kernel grants AMX tile permission, where llama.cpp's AMX kernel then dies with
SIGILL at warm-up. Only executing the instruction tells, so each probe runs a few bytes
of machine code in a child process (a trap kills the child, never us):

* ``avx2``:     ``vpxor ymm0, ymm0, ymm0``
* ``avx512f``:  ``vpxord zmm0, zmm0, zmm0``
* ``amx``:      ``arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)``, ``ldtilecfg``, ``tilezero tmm0``,
  ``tilerelease``

A feature the CPU does not list is not executed (it would trap by design). The result is
cached per machine and boot (CPU model, flags, kernel release, boot id) in the cache
folder; ``ENGINEROOM_CPU_PROBE_FORCE=amx=trap[,avx512f=trap]`` makes the probe report a trap
without running it, so the fallback path can be exercised on any machine (the forced
result is never cached, and says that it was forced).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import paths

FORCE_ENV = "ENGINEROOM_CPU_PROBE_FORCE"

# feature -> (the /proc/cpuinfo flags it needs, the flags it stands for when it traps)
FEATURES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "avx2": (("avx2",), ("avx2",)),
    "avx512f": (("avx512f",), ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512_vnni",
                              "avx512_bf16", "avx512vbmi", "avx512_vbmi2", "avx512ifma", "avx512_bitalg",
                              "avx512_vpopcntdq", "avx512_fp16")),
    "amx": (("amx_tile",), ("amx_tile", "amx_int8", "amx_bf16", "amx_fp16", "amx_complex")),
}

# Machine code (x86-64 System V; rdi = pointer to a 64-byte tile config for AMX).
_CODE: dict[str, bytes] = {
    "avx2": bytes.fromhex("c5fdefc0" "c5f877" "c3"),                 # vpxor ymm0; vzeroupper; ret
    "avx512f": bytes.fromhex("62f17d48efc0" "c5f877" "c3"),          # vpxord zmm0; vzeroupper; ret
    # ldtilecfg [rdi]; tilezero tmm0; tilerelease; ret
    "amx": bytes.fromhex("c4e2784907" "c4e27b49c0" "c4e27849c0" "c3"),
    "ud2": bytes.fromhex("0f0b"),   # always SIGILL: lets a test see the trap path on any x86-64 machine
}

_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18
_SYS_ARCH_PRCTL = 158


@dataclass(frozen=True)
class CpuProbe:
    model: str
    arch: str
    flags: frozenset[str]
    results: dict[str, str] = field(default_factory=dict)   # feature -> ok | trap: SIGILL | not listed | ...
    forced: tuple[str, ...] = ()                            # features whose result ENGINEROOM_CPU_PROBE_FORCE set
    cached: bool = False

    @property
    def traps(self) -> frozenset[str]:
        """Features the CPU lists but that do not execute here."""
        return frozenset(f for f, r in self.results.items() if r.startswith("trap"))

    @property
    def usable(self) -> frozenset[str]:
        """The listed flags minus every flag of a feature that traps."""
        dropped: set[str] = set()
        for feature in self.traps:
            dropped.update(FEATURES[feature][1])
        return frozenset(self.flags - dropped)

    def why(self, feature: str) -> str:
        """One phrase for a run's conditions: what was found and how."""
        result = self.results.get(feature, "not probed")
        needs = "/".join(FEATURES[feature][0])
        listed = all(n in self.flags for n in FEATURES[feature][0])
        how = (f"forced by {FORCE_ENV}" if feature in self.forced
               else "executed in a child process" if listed else "not executed")
        return f"{feature}: {result} ({how}; CPU {self.model!r} {'lists' if listed else 'does not list'} {needs})"

    def as_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["flags"] = sorted(self.flags)
        d["traps"] = sorted(self.traps)
        return d


def _cpuinfo() -> tuple[str, frozenset[str]]:
    model, flags = platform.processor() or platform.machine(), frozenset[str]()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return model, flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model in (platform.processor(), platform.machine(), ""):
            model = value.strip()
        elif key == "flags" and not flags:
            flags = frozenset(value.split())
    return model, flags


def _cache_key(model: str, flags: frozenset[str]) -> str:
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    raw = json.dumps([model, sorted(flags), platform.release(), boot, sys.version_info[:2]])
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _run_one(feature: str, timeout: float = 20.0) -> str:
    try:
        code = f"from engineroom.cpuprobe import _execute; _execute({feature!r})"
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "unknown: the probe did not finish"
    except OSError as exc:
        return f"unknown: {exc.strerror}"
    if proc.returncode == 0:
        return "ok"
    if proc.returncode < 0:
        return f"trap: {_signal_name(proc.returncode)}"
    last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    if proc.returncode == 3:       # the kernel refused (AMX permission): the instruction cannot run
        return f"trap: {last}"
    return f"unknown: {last}"


def _execute(feature: str) -> None:
    """Child-process body: run the feature's instructions once (dies by signal if they trap)."""
    import ctypes
    import mmap

    code = _CODE[feature]
    if feature == "amx":
        libc = ctypes.CDLL(None, use_errno=True)
        rc = libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA)
        if rc != 0:
            sys.stderr.write(f"the kernel refused AMX tile permission (errno {ctypes.get_errno()})\n")
            sys.exit(3)
    buf = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    buf.write(code)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(addr)
    cfg = (ctypes.c_uint8 * 64)()
    cfg[0] = 1                                 # palette 1
    cfg[16], cfg[17] = 64, 0                   # tmm0: 64 bytes per row
    cfg[48] = 16                               # tmm0: 16 rows
    fn(ctypes.addressof(cfg))
    sys.exit(0)


def _forced() -> dict[str, str]:
    raw = os.environ.get(FORCE_ENV, "").strip()
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in raw.split(","))):
        feature, _, result = part.partition("=")
        if feature in FEATURES and result in ("trap", "ok"):
            out[feature] = "trap: forced" if result == "trap" else "ok"
    return out


def probe_cpu(refresh: bool = False) -> CpuProbe:
    """The CPU's listed flags and, for each probed feature it lists, whether it really runs."""
    model, flags = _cpuinfo()
    arch = platform.machine()
    forced = _forced()
    results: dict[str, str] = {}
    cache = _cache_path(model, flags)
    cached = False
    if not refresh and cache.is_file():
        try:
            results = dict(json.loads(cache.read_text())["results"])
            cached = True
        except (OSError, ValueError, KeyError, TypeError):
            results = {}
    if not results:
        for feature, (needs, _) in FEATURES.items():
            if arch not in ("x86_64", "AMD64") or platform.system() != "Linux":
                results[feature] = "not probed: only x86-64 Linux is probed"
            elif not all(n in flags for n in needs):
                results[feature] = "not listed"
            else:
                results[feature] = _run_one(feature)
        _write_cache(cache, model, results)   # unwritable: it only costs a re-probe next time
    for feature, result in forced.items():
        if all(n in flags for n in FEATURES[feature][0]) or result.startswith("trap"):
            results[feature] = result
    return CpuProbe(model=model, arch=arch, flags=flags, results=results,
                    forced=tuple(sorted(forced)), cached=cached)


def remember_trap(feature: str, why: str) -> bool:
    """An engine died by SIGILL in its ``feature`` kernels although the probe ran them: the feature traps on this
    machine after all (seen: an AMX VM where ``ldtilecfg``/``tilezero``/``tdpbssd`` run in the probe's child and
    llama.cpp's AMX kernel still dies at ``tilezero`` on every warm-up). Kept in the probe's cache for this machine
    and boot, so every later plan and launch leaves it out from the start. False when the CPU does not list it,
    it is known to trap already, or ENGINEROOM_CPU_PROBE_FORCE decides it (a forced answer is never written)."""
    model, flags = _cpuinfo()
    if feature not in FEATURES or not all(n in flags for n in FEATURES[feature][0]):
        return False
    probe = probe_cpu()                   # probed and cached when it was not yet
    if feature in probe.traps or feature in probe.forced:
        return False
    cache = _cache_path(model, flags)
    try:
        results = dict(json.loads(cache.read_text())["results"]) if cache.is_file() else dict(probe.results)
    except (OSError, ValueError, KeyError, TypeError):
        results = dict(probe.results)
    return _write_cache(cache, model, {**results, feature: f"trap: {why}"})


def _cache_path(model: str, flags: frozenset[str]) -> Path:
    return paths.cache_dir() / "cpuprobe" / f"{_cache_key(model, flags)}.json"


def _write_cache(cache: Path, model: str, results: dict[str, str]) -> bool:
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".tmp")
        tmp.write_text(json.dumps({"model": model, "results": results}))
        os.replace(tmp, cache)
    except OSError:
        return False
    return True


__all__ = ["FEATURES", "FORCE_ENV", "CpuProbe", "probe_cpu", "remember_trap"]
