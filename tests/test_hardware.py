"""Rig specs and detection of this (GPU-less) machine."""

from __future__ import annotations

import sys

import pytest

from engineroom.errors import BadInput
from engineroom.hardware import GpuSpec, Rig, detect_rig, parse_rig, resolve_rig


def test_two_3090s():
    rig = parse_rig("2x3090")
    assert rig.n_gpus == 2 and rig.label == "2x3090"
    g = rig.gpus[0]
    assert (g.name, g.vram_bytes, g.bandwidth_gbs, g.compute_capability, g.vendor) == (
        "RTX 3090", 24 * 2**30, 936, "8.6", "nvidia")      # its "24 GB" is what nvidia-smi reports: 24,576 MiB


def test_h200_mixed_cpu_and_apple():
    # the card's total as NVML reported it on the lent H200 (its "141 GB" is neither 141e9 nor 141 GiB)
    assert parse_rig("1xH200").gpus[0].vram_bytes == 150_754_820_096
    mixed = parse_rig("3090+4090")
    assert [g.hw_class for g in mixed.gpus] == ["3090", "4090"]
    cpu = parse_rig("cpu:64GB")
    assert cpu.gpus == () and cpu.cpu_ram_bytes == 64_000_000_000 and cpu.vendor == "cpu"
    mac = parse_rig("m3max:128GB")
    assert mac.gpus[0].vendor == "apple" and mac.gpus[0].unified and mac.cpu_ram_bytes == 128_000_000_000
    assert mac.gpus[0].vram_bytes == 96_000_000_000 and mac.gpus[0].bandwidth_gbs == 400


@pytest.mark.parametrize("spec", ["0x3090", "9x", "foo", "cpu:-3GB", "", "2x3090:48GB", "99x3090", "cpu:64GB+cpu:32GB",
                                  "3090+m3max:64GB"])
def test_impossible_specs_are_one_sentence_with_known_classes(spec):
    with pytest.raises(BadInput) as err:
        parse_rig(spec)
    msg = str(err.value)
    assert "\n" not in msg and "3090" in msg and "h200" in msg and "m3max" in msg


def test_detection_without_nvidia_returns_cpu_rig_with_note():
    rig = detect_rig()
    assert rig.source == "detected"
    if rig.gpus:  # pragma: no cover - only on a GPU machine
        pytest.skip("this machine has an NVIDIA GPU")
    assert rig.cpu_cores and rig.cpu_ram_bytes and rig.cpu_ram_bytes > 0
    assert any(n.startswith("no NVIDIA GPU detected (") for n in rig.notes)


def test_detection_survives_a_broken_nvml(monkeypatch):
    class Broken:
        class NVMLError(Exception):
            pass

        def nvmlInit(self):
            raise RuntimeError("Driver Not Loaded")

    monkeypatch.setitem(sys.modules, "pynvml", Broken())
    rig = detect_rig()
    assert rig.gpus == () and "no NVIDIA GPU detected (NVML: Driver Not Loaded)" in rig.notes[0]


def test_detection_with_fake_nvml(monkeypatch):
    import types

    class E(Exception):
        pass

    mem = types.SimpleNamespace(total=24_000_000_000, free=23_000_000_000)
    fake = types.SimpleNamespace(
        NVMLError=E, NVML_P2P_CAPS_INDEX_READ=0, NVML_P2P_STATUS_OK=0, NVML_FEATURE_ENABLED=1, NVML_NVLINK_MAX_LINKS=2,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlSystemGetDriverVersion=lambda: "580.1",
        nvmlDeviceGetCount=lambda: 2, nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: "NVIDIA GeForce RTX 3090", nvmlDeviceGetMemoryInfo=lambda h: mem,
        nvmlDeviceGetCudaComputeCapability=lambda h: (8, 6), nvmlDeviceGetUUID=lambda h: f"GPU-{h}",
        nvmlDeviceGetP2PStatus=lambda a, b, c: 0, nvmlDeviceGetNvLinkState=lambda h, link: 0,
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    rig = detect_rig()
    assert rig.n_gpus == 2 and rig.driver == "580.1" and rig.p2p is True and rig.nvlink is False
    g = rig.gpus[0]
    assert g.hw_class == "3090" and g.bandwidth_gbs == 936 and g.free_bytes == 23_000_000_000
    assert g.compute_capability == "8.6"


def test_resolve_rig_defaults_to_this_machine():
    assert resolve_rig(None).label == "this machine"
    assert resolve_rig("1x4090").gpus[0].hw_class == "4090"


def test_contract_fields_kept():
    g = GpuSpec(name="x", vram_bytes=1, bandwidth_gbs=None, compute_capability=None)
    r = Rig(gpus=(g,))
    assert g.vendor == "nvidia" and g.free_bytes is None and r.n_gpus == 1 and r.p2p is None and r.label == ""


# ---- the CPU: model name, threads, memory bandwidth (what plan assumes) ----------------

X86_CPUINFO = ("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC  9B14 96-Core Processor\n"
               "flags\t: fpu\n")
ARM_CPUINFO = "processor\t: 0\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd\nModel\t\t: Raspberry Pi 5 Model B Rev 1.0\n"


def test_cpu_model_name_from_cpuinfo():
    from engineroom.hardware import cpu_model_name

    assert cpu_model_name(X86_CPUINFO) == "AMD EPYC 9B14 96-Core Processor"
    assert cpu_model_name(ARM_CPUINFO) == "Raspberry Pi 5 Model B Rev 1.0"


def test_physical_cores_counts_thread_sibling_sets(tmp_path):
    from engineroom.hardware import physical_cores

    for cpu, sib in ((0, "00000003"), (1, "00000003"), (2, "0000000c"), (3, "0000000c")):
        d = tmp_path / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "thread_siblings").write_text(sib + "\n")
    assert physical_cores(str(tmp_path)) == 2          # 4 logical CPUs, 2 SMT pairs
    assert physical_cores(str(tmp_path / "none")) is None


def test_copy_probe_measures_and_is_cached_per_machine(monkeypatch, tmp_path):
    from engineroom import hardware

    monkeypatch.setenv("ENGINEROOM_CACHE_DIR", str(tmp_path))      # not the last session's figures
    assert hardware.probe_copy_bandwidth(1, mib=8, reps=1) > 0
    calls = []
    monkeypatch.setattr(hardware, "probe_copy_bandwidth", lambda t, **k: calls.append(t) or 10.0 * t)
    monkeypatch.delenv(hardware.ENV_NO_PROBE, raising=False)
    key = dict(model="Test CPU 1", logical=4, ram=8 * 10**9)
    first = hardware.cpu_bandwidth(2, **key)
    assert first["gbs"] == {"1": 10.0, "2": 20.0} and len(calls) == 2 and len(first["loadavg"]) == 3
    assert hardware.cpu_bandwidth(2, **key) == first and len(calls) == 2        # cached: no new probe
    hardware.cpu_bandwidth(2, refresh=True, **key)
    assert len(calls) == 4                                                      # --probe measures again
    monkeypatch.setenv(hardware.ENV_NO_PROBE, "1")
    assert hardware.cpu_bandwidth(2, model="Other CPU", logical=4, ram=1) is None
    monkeypatch.undo()
    with pytest.raises(BadInput, match="at least 1 thread"):
        hardware.probe_copy_bandwidth(0)


def test_detected_cpu_rig_says_model_threads_and_bandwidth_source(monkeypatch):
    from engineroom import hardware

    monkeypatch.setattr(hardware, "probe_copy_bandwidth", lambda t, **k: 7.5 * t)
    rig = detect_rig()
    if rig.gpus:  # pragma: no cover - only on a GPU machine
        pytest.skip("this machine has an NVIDIA GPU")
    assert rig.cpu_model and rig.cpu_threads and rig.cpu_threads >= 1
    measured = dict(rig.cpu_bandwidth_by_threads)
    assert rig.cpu_bandwidth_gbs == measured[rig.cpu_threads]
    assert rig.cpu_bandwidth_source.startswith("measured on this machine")
    off = detect_rig(probe=False)
    assert off.cpu_bandwidth_by_threads == () and off.cpu_bandwidth_source.startswith("catalog default")
    assert parse_rig("cpu:64GB").cpu_bandwidth_source.startswith("catalog default for 'cpu' (not measured)")


def test_cli_hardware_shows_cpu_model_and_assumed_bandwidth():
    import json as _json

    from engineroom.hardware import cpu_model_name

    from conftest import cli

    j = cli("hardware", "--json")
    assert j.returncode == 0, j.stderr
    data = _json.loads(j.stdout)
    assert data["cpu_model"] == cpu_model_name() and data["cpu_threads"] >= 1
    assert data["cpu_bandwidth_gbs"] > 0 and data["cpu_bandwidth_source"]
    if not data["gpus"]:
        assert data["cpu_bandwidth_source"].startswith("measured on this machine")
    t = cli("hardware")
    assert t.returncode == 0, t.stderr
    flat = " ".join(t.stdout.split())
    assert f"CPU: {cpu_model_name()}" in flat and "CPU memory bandwidth plan assumes:" in flat
    assert f"{data['cpu_bandwidth_gbs']:g} GB/s at {data['cpu_threads']} thread(s)" in flat
    off = cli("hardware", env={"ENGINEROOM_NO_BW_PROBE": "1"})
    assert off.returncode == 0, off.stderr
    if not data["gpus"]:
        assert "catalog default for 'cpu' (not measured)" in " ".join(off.stdout.split())
