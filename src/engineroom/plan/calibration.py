"""Speed calibration: the plan's decode model corrected by what this machine measured.

A calibration point is one stored measurement on this machine: a single-stream decode rate
(tokens/s, the bench's measured requests) beside the middle of the plan's *uncalibrated* band
for the same launch (what the catalog's efficiency said then). Its ratio, measured / planned,
is how far the catalog's model is off for this device and engine. ``flows`` reads the points
from the store (``try`` runs record both numbers) and hands them to ``plan``; this module holds
no store access and no machine detection.

The factor a candidate gets: the median ratio of the points of its engine, weight family and shape class
(dense, MoE, hybrid MoE, hybrid, MLA, sliding window), else of its engine and weight family over every shape
measured (said: "from other shapes"), else none ("uncalibrated: the catalog's efficiency"). Engines never
borrow each other's points, nor weight families (``weight_family``): one engine runs them through other
kernels (vLLM's CPU build decoded SmolLM2's shape at 0.35x the catalog's band with AWQ weights at float16,
and its 16-bit picks there run at float32). A point stored before the family was recorded counts for every
family of its engine. The same factor scales the single-stream band and the concurrent estimate (no
concurrent point calibrates the batch model yet).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..arch import LayerKind, ModelArch

__all__ = ["NO_POINT_HERE", "Calibration", "SpeedFactor", "SpeedPoint", "UNCALIBRATED", "shape_class",
           "weight_family"]

UNCALIBRATED = "uncalibrated: the catalog's efficiency"
NO_POINT_HERE = f"{UNCALIBRATED} (no run of this engine and weight family measured on this machine yet)"
_SIXTEEN_BIT = frozenset({"bf16", "f16", "fp16", "f32", "fp32"})


def weight_family(quant_format: str | None) -> str:
    """The family whose decode one calibration point speaks for: the weights' format (gguf, awq, gptq, fp8 ...),
    the 16-bit and 32-bit checkpoints one family ("16-bit"); "" where no format is known (any family)."""
    fmt = (quant_format or "").lower()
    return "16-bit" if fmt in _SIXTEEN_BIT else fmt


def shape_class(arch: ModelArch) -> str:
    """The class of shape whose decode behaves alike: hybrid-moe, moe, mla, hybrid, sliding or dense.
    A MoE with linear-attention layers is a class of its own: on the H200 the catalog's model put a plain
    MoE (Qwen3-30B-A3B) 28% under what it decoded and a hybrid one (the 35B-A3B layout) 11% over, so one
    class for both had each calibrate the other the wrong way (benchmarks/try_gpu.md, second visit)."""
    if arch.moe is not None:
        return "hybrid-moe" if arch.is_hybrid else "moe"
    if arch.mla is not None:
        return "mla"
    if arch.is_hybrid:
        return "hybrid"
    if LayerKind.SLIDING in arch.kind_counts:
        return "sliding"
    return "dense"


@dataclass(frozen=True)
class SpeedPoint:
    """One single-stream decode measurement on this machine, beside the plan's band of its day."""

    run_id: int
    engine: str
    shape: str                  # shape_class of the model measured
    model: str                  # what was measured (for the provenance line)
    measured_tps: float
    planned_mid_tps: float      # the middle of the plan's uncalibrated band for that launch
    family: str = ""            # weight_family of the weights measured ("": recorded before families were)

    @property
    def ratio(self) -> float:
        return self.measured_tps / self.planned_mid_tps

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "engine": self.engine, "shape": self.shape, "model": self.model,
                "measured_tps": round(self.measured_tps, 2), "planned_mid_tps": round(self.planned_mid_tps, 2),
                "family": self.family}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SpeedPoint | None:
        """A point from what ``to_dict`` wrote; None for anything that cannot be one (a damaged record)."""
        try:
            p = cls(run_id=int(d["run_id"]), engine=str(d["engine"]), shape=str(d["shape"]), model=str(d["model"]),
                    measured_tps=float(d["measured_tps"]), planned_mid_tps=float(d["planned_mid_tps"]),
                    family=str(d.get("family") or ""))
        except (KeyError, TypeError, ValueError):
            return None
        return p if p.measured_tps > 0 and p.planned_mid_tps > 0 else None


@dataclass(frozen=True)
class SpeedFactor:
    """This machine's correction of an engine's decode speed, and the runs it rests on."""

    factor: float
    runs: tuple[int, ...]
    same_shape: bool

    @property
    def text(self) -> str:
        n = len(self.runs)
        ids = ", ".join(f"#{r}" for r in self.runs[:6]) + (", ..." if n > 6 else "")
        of = "this shape class" if self.same_shape else "other shapes (none of this class yet)"
        return f"calibrated x{self.factor:.2f} from {n} run{'s' if n != 1 else ''} of {of} on this machine ({ids})"


@dataclass(frozen=True)
class Calibration:
    """The points measured on this machine (``device``: what they were measured on)."""

    device: str
    points: tuple[SpeedPoint, ...] = ()

    @classmethod
    def of(cls, device: str, points: Iterable[SpeedPoint]) -> Calibration:
        return cls(device, tuple(points))

    def factor(self, engine: str, shape: str, family: str = "") -> SpeedFactor | None:
        """The correction for ``engine`` on a model of class ``shape`` with weights of ``family``
        (``weight_family``); None without a point of that engine and family."""
        mine = [p for p in self.points if p.engine == engine and (not p.family or not family or p.family == family)]
        same = [p for p in mine if p.shape == shape]
        use = same or mine
        if not use:
            return None
        # imported here: most plans have no speed point to correct, and `plan` pays for each import
        import statistics

        return SpeedFactor(statistics.median(p.ratio for p in use), tuple(sorted(p.run_id for p in use)),
                           same_shape=bool(same))
