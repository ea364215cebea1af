"""What ``engineroom tune`` may change on llama-server, by objective (``Engine.tune_knobs``).

Each knob is a launch setting engineroom names (threads, slots, KV type) or llama-server's own
arguments (``-fa off``, ``-bs``), with the values to try beside the pick's; ``command.py`` reads
flash attention (and a micro-batch given by hand) back into the settled launch, so fit sizes what runs.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..base import Knob
from .command import FLASH_ATTN_FLAGS, MAX_SEQS

BACKEND_SAMPLING = "-bs"          # --backend-sampling: sampling on the GPU (experimental in b11434)


def tune_knobs(objective: str, *, kv_dtype: str | None, parallel: int, cpu_cores: int | None,
               kv_dtypes: Sequence[str]) -> tuple[Knob, ...]:
    """What ``engineroom tune`` tries on llama-server, most telling first, for ``objective``
    (``decode_tps``: one stream's decode; ``aggregate_tps``: every slot decoding at once).

    Threads (CPU only): llama-server's threads spin while they wait, so fewer than the cores can
    decode faster on a machine that also runs the client. On a GPU, one stream's step is short enough
    for its fixed costs to show: flash attention off (its kernels against the plain ones) and sampling
    on the GPU (``-bs``, no logits copied back each token). KV type: a smaller cache is less to read
    per token, a quantized one costs dequantizing. For throughput: the slots (twice and half the
    pick's, each sized by fit at launch). Not the micro-batch ``-ub``: the throughput objective is the
    rate while every slot decodes, whose steps carry one token a slot, at most 256 (``MAX_SEQS``), which
    no ``-ub`` of 256 or more splits; ``-ub`` moves prompt processing and the compute buffer, not that
    rate, and a trial of it costs 4 boots of 32-64 busy slots (5-8 minutes on the H200 visit of
    2026-12-04, ``benchmarks/tune_gpu.md``)."""
    knobs: list[Knob] = []
    if cpu_cores:
        counts = tuple(sorted({n for n in (cpu_cores - 1, cpu_cores // 2) if n >= 1}, reverse=True))
        if counts:
            knobs.append(Knob("threads (-t)", "threads", counts,
                              f"decode threads on {cpu_cores} cores (the default is every core)"))
    elif objective == "decode_tps":
        knobs.append(Knob("GPU sampling (-bs)", "engine_args", ((BACKEND_SAMPLING,),),
                          "sampling on the GPU instead of copying the logits back each token"))
        knobs.append(Knob("flash attention (-fa)", "engine_args", ((FLASH_ATTN_FLAGS[0], "off"),),
                          "the plain attention kernels against flash attention (the default)"))
    if objective == "aggregate_tps":
        slots = tuple(n for n in (parallel * 2, parallel // 2) if 1 <= n <= MAX_SEQS and n != parallel)
        if slots:
            knobs.append(Knob("slots (-np)", "parallel", slots, f"concurrent sequences beside the pick's {parallel}"))
    current = (kv_dtype or "f16").lower()
    others = tuple(k for k in ("f16", "q8_0") if k != current and k in kv_dtypes)
    if others:
        knobs.append(Knob("KV type (-ctk/-ctv)", "kv_dtype", others, f"the cache's type beside the pick's {current}"))
    return tuple(knobs)
