"""What a machine has (this one, through NVML and psutil) or what a rig spec describes.

CONTRACT: ``Rig`` / ``GpuSpec`` are the hardware input of fit and plan. Detection of this
machine and parsing of rig spec strings ("2x3090", "1xH200", "cpu:64GB") live here;
hardware classes (VRAM, bandwidth, compute capability) come from the catalog.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    name: str                         # "RTX 3090", "H200"
    vram_bytes: int                   # total memory of the device
    bandwidth_gbs: float | None       # datasheet memory bandwidth, GB/s
    compute_capability: str | None    # "8.6"; None for non-NVIDIA
    vendor: str = "nvidia"            # nvidia | amd | apple | intel
    free_bytes: int | None = None     # detected free memory (None for a rig spec)


@dataclass(frozen=True)
class Rig:
    gpus: tuple[GpuSpec, ...]         # empty = CPU only
    cpu_ram_bytes: int | None = None
    cpu_cores: int | None = None
    cpu_bandwidth_gbs: float | None = None
    p2p: bool | None = None           # NVLink/P2P between GPUs when known
    label: str = ""                   # the spec string or "this machine"

    @property
    def n_gpus(self) -> int:
        return len(self.gpus)
