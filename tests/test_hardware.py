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
    assert (g.name, g.vram_bytes, g.bandwidth_gbs, g.compute_capability, g.vendor) == ("RTX 3090", 24_000_000_000, 936, "8.6", "nvidia")


def test_h200_mixed_cpu_and_apple():
    assert parse_rig("1xH200").gpus[0].vram_bytes == 141_000_000_000
    mixed = parse_rig("3090+4090")
    assert [g.hw_class for g in mixed.gpus] == ["3090", "4090"]
    cpu = parse_rig("cpu:64GB")
    assert cpu.gpus == () and cpu.cpu_ram_bytes == 64_000_000_000 and cpu.vendor == "cpu"
    mac = parse_rig("m3max:128GB")
    assert mac.gpus[0].vendor == "apple" and mac.gpus[0].unified and mac.cpu_ram_bytes == 128_000_000_000
    assert mac.gpus[0].vram_bytes == 96_000_000_000 and mac.gpus[0].bandwidth_gbs == 400


@pytest.mark.parametrize("spec", ["0x3090", "9x", "foo", "cpu:-3GB", "", "2x3090:48GB", "99x3090", "cpu:64GB+cpu:32GB", "3090+m3max:64GB"])
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
    assert g.hw_class == "3090" and g.bandwidth_gbs == 936 and g.free_bytes == 23_000_000_000 and g.compute_capability == "8.6"


def test_resolve_rig_defaults_to_this_machine():
    assert resolve_rig(None).label == "this machine"
    assert resolve_rig("1x4090").gpus[0].hw_class == "4090"


def test_contract_fields_kept():
    g = GpuSpec(name="x", vram_bytes=1, bandwidth_gbs=None, compute_capability=None)
    r = Rig(gpus=(g,))
    assert g.vendor == "nvidia" and g.free_bytes is None and r.n_gpus == 1 and r.p2p is None and r.label == ""
