"""The CPU probe: instructions are executed in a child process, never trusted from the flags."""

from __future__ import annotations

import platform

import pytest

from engineroom import cpuprobe

x86_linux = pytest.mark.skipif(platform.machine() != "x86_64" or platform.system() != "Linux",
                               reason="the probe executes x86-64 machine code on Linux only")


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ENGINEROOM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(cpuprobe.FORCE_ENV, raising=False)


@x86_linux
def test_a_trapping_instruction_is_seen_as_a_trap():
    # ud2 raises SIGILL on every x86-64 CPU: the same path an AMX trap under a hypervisor takes
    assert cpuprobe._run_one("ud2") == "trap: SIGILL"


@x86_linux
def test_listed_features_are_executed_and_unlisted_ones_are_not():
    probe = cpuprobe.probe_cpu(refresh=True)
    assert probe.flags, "/proc/cpuinfo lists flags on x86-64 Linux"
    for feature, (needs, _) in cpuprobe.FEATURES.items():
        result = probe.results[feature]
        if all(n in probe.flags for n in needs):
            assert result == "ok" or result.startswith("trap"), (feature, result)
        else:
            assert result == "not listed", (feature, result)
    # what traps is dropped from the usable flags, what runs stays
    for feature in probe.traps:
        assert not set(cpuprobe.FEATURES[feature][1]) & probe.usable
    if probe.results["avx2"] == "ok":
        assert "avx2" in probe.usable


@x86_linux
def test_result_is_cached_per_machine_and_boot():
    first = cpuprobe.probe_cpu(refresh=True)
    second = cpuprobe.probe_cpu()
    assert not first.cached and second.cached
    assert second.results == first.results


def test_forced_trap_changes_the_result_and_says_so(monkeypatch):
    monkeypatch.setenv(cpuprobe.FORCE_ENV, "amx=trap")
    probe = cpuprobe.probe_cpu()
    assert "amx" in probe.traps
    assert probe.forced == ("amx",)
    assert "forced by ENGINEROOM_CPU_PROBE_FORCE" in probe.why("amx")
    assert not {"amx_tile", "amx_int8", "amx_bf16"} & probe.usable
    monkeypatch.delenv(cpuprobe.FORCE_ENV)
    assert "amx" not in cpuprobe.probe_cpu().forced   # a forced result is never cached


def test_force_values_that_are_not_understood_are_ignored(monkeypatch):
    monkeypatch.setenv(cpuprobe.FORCE_ENV, "amx=maybe,nonsense=trap,,")
    assert cpuprobe.probe_cpu().forced == ()


def test_hardware_shows_what_the_probe_found(monkeypatch):
    import json

    from conftest import cli

    proc = cli("hardware", "--json", env={cpuprobe.FORCE_ENV: "amx=trap", "ENGINEROOM_NO_BW_PROBE": "1"})
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)["cpu_instructions"]
    assert found["results"]["amx"] == "trap: forced" and found["forced"] == ["amx"]
    assert "amx_tile" not in found["usable_flags"]
    text = cli("hardware", env={cpuprobe.FORCE_ENV: "amx=trap", "ENGINEROOM_NO_BW_PROBE": "1"})
    assert "amx trap: forced (forced)" in text.stdout


def test_an_engine_that_dies_in_its_amx_kernel_teaches_the_probe_for_this_boot(monkeypatch):
    """Seen on an AMX VM: the probe's AMX instructions run, llama.cpp's AMX kernel still dies by SIGILL at every
    warm-up. The crash's fallback (--no-repack) remembers the trap in the probe's cache for this machine and boot,
    so later plans and launches leave AMX out from the start; a CPU that does not list AMX is not marked."""
    import signal

    from engineroom.engines.llamacpp import cpu_adjustments, crash_fallback

    model, flags = cpuprobe._cpuinfo()
    monkeypatch.setattr(cpuprobe, "_cpuinfo", lambda: (model, flags - {"amx_tile"}))
    assert cpuprobe.remember_trap("amx", "the engine said so") is False
    monkeypatch.setattr(cpuprobe, "_run_one", lambda feature: "ok")          # the probe's instructions run
    monkeypatch.setattr(cpuprobe, "_cpuinfo", lambda: (model, flags | {"amx_tile", "amx_int8"}))
    assert "amx" not in cpuprobe.probe_cpu(refresh=True).traps and not cpu_adjustments(cpuprobe.probe_cpu())
    change = crash_fallback(["/x/llama-server", "-m", "m.gguf"], -signal.SIGILL)
    assert change is not None and change.args == ("-nr",)
    probe = cpuprobe.probe_cpu()
    assert probe.cached and "amx" in probe.traps, probe.results
    assert probe.results["amx"].startswith("trap: llama-server died by SIGILL at warm-up"), probe.results
    assert not {"amx_tile", "amx_int8"} & probe.usable
    [adjust] = cpu_adjustments(probe)
    assert adjust.args == ("-nr",) and "llama-server died by SIGILL" in adjust.why
    assert crash_fallback(["/x/llama-server", "-nr"], -signal.SIGILL) is None      # nothing left to try
    monkeypatch.setenv(cpuprobe.FORCE_ENV, "amx=ok")        # a forced answer is never remembered over
    assert cpuprobe.remember_trap("amx", "again") is False
    monkeypatch.delenv(cpuprobe.FORCE_ENV)
    assert cpuprobe.probe_cpu().results["amx"].startswith("trap: llama-server died by SIGILL")
