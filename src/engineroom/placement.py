"""Where the engine put a launch, beside where the plan put it: layers, weights, KV, context, slots.

The engine's adapter reads its own placement from its log (``Engine.placement_report`` ->
``Placement``); the flow builds the plan's from fit's prediction (``planned``). ``differences``
lists every way the engine's placement falls short of the plan's — layers, weights or KV cache in
host memory where the plan had them on a GPU, a smaller context, a slot holding less, fewer slots
— each with what it costs; ``sentence`` says all of it in one sentence. `up` fails a launch that
has any, unless the user accepts it (``--accept-placement``); bench's integrity checklist reads
the verdict stored with the launch (``check_record``).

Sizes are not compared here (``memory.compare`` does that, per component): a buffer counts as
moved only when the host holds more weights than the plan put there by more than
``HOST_WEIGHTS_SLACK`` (fit's host-side estimate is within 0.3% on an H200; a moved layer is
hundreds of MiB). One size is a placement fact: GPU weights over ``WEIGHTS_OTHER_PRECISION`` x the
plan's are the pick's weights at another precision (an int4 pick held at 16 bits is 3x and more,
an fp8 one 1.9x; fit's bits-per-weight estimates of packed checkpoints are within 10% of what vLLM
loaded), so the figures measured are not the pick's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .units import GiB, gib, mib

HOST_WEIGHTS_SLACK = (0.02, 64 * 1024 * 1024)   # 2% of the planned host weights, at least 64 MiB
# vLLM 0.26 loaded a gptq-int4 pick of Qwen3.6-27B planned at 16.3 GiB as 50.2 GiB of 16-bit weights (H100,
# 2026-12-05; the folder named no quantized modules), and decoded 47.6 tok/s under the plan's 66-101
# (and by at least 256 MiB: a toy model's buffers are padded past the ratio)
WEIGHTS_OTHER_PRECISION = (1.35, 256 * 1024 * 1024)


def _size(n: int | None) -> str:
    """GiB from 1 GiB up, whole MiB below (a 3 MiB embedding is not "0.00 GiB")."""
    return gib(n, 2) if n is not None and n >= GiB else mib(n, 0)


@dataclass(frozen=True)
class Placement:
    """One launch's placement (the plan's or the engine's); None = not known / not reported."""

    device: str = "cpu"                      # "cpu": the host is the device; "gpu": the plan has GPUs
    layers_on_gpu: int | None = None         # layers offloaded to the GPUs (llama.cpp: "offloaded N/M")
    layers_total: int | None = None          # layers the engine can offload (M; the output layer included)
    gpu_weights_bytes: int | None = None
    host_weights_bytes: int | None = None    # weights in host memory (mapped, pinned or copied)
    host_kv_bytes: int | None = None         # KV cache in host memory on a GPU launch
    ctx_total: int | None = None             # KV cells of the whole cache (llama.cpp n_ctx = -c)
    ctx_per_slot: int | None = None          # tokens one sequence may hold (llama-server n_ctx_slot)
    slots: int | None = None                 # sequences served at once (n_seq_max / n_slots)
    engine_changes: tuple[str, ...] = ()     # the engine's own words for what its fitting changed
    source: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class Difference:
    what: str          # "layers", "host_weights", "gpu_weights", "host_kv", "ctx_total", "ctx_per_slot", "slots"
    planned: Any
    actual: Any
    text: str          # the difference, in words
    cost: str          # what it costs the user

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def planned(predicted: Mapping[str, Any], request: Mapping[str, Any]) -> Placement | None:
    """The plan's placement from fit's prediction (its components, ``GPU<i>`` per GPU used) and the
    request it sized; None when there was no prediction."""
    if not request or request.get("ctx") is None:
        return None
    gpu = any(str(k).startswith("GPU") for k in predicted)
    ctx, parallel = int(request["ctx"]), int(request.get("parallel") or 1)
    weights = int(predicted.get("weights") or 0)
    return Placement(
        device="gpu" if gpu else "cpu",
        gpu_weights_bytes=weights if gpu else None,
        host_weights_bytes=int(predicted.get("weights_embedding") or 0) if gpu else None,
        host_kv_bytes=0 if gpu else None,
        ctx_total=ctx * parallel, ctx_per_slot=ctx, slots=parallel,
        source="fit's prediction for this launch: every layer on the GPU(s), the token embedding on the host"
        if gpu else "fit's prediction for this launch (the host is the device)",
    )


def differences(plan: Placement, actual: Placement) -> list[Difference]:
    """Every way ``actual`` falls short of ``plan`` (more than the plan asked for is no difference)."""
    out: list[Difference] = []
    if plan.device == "gpu":
        if actual.layers_total and actual.layers_on_gpu is not None and actual.layers_on_gpu < actual.layers_total:
            off = actual.layers_total - actual.layers_on_gpu
            out.append(Difference("layers", actual.layers_total, actual.layers_on_gpu,
                                  f"{off} of {actual.layers_total} layers on the CPU, not the GPU",
                                  "each token's decode runs those layers at host-memory speed"))
        planned_host = plan.host_weights_bytes or 0
        slack = max(HOST_WEIGHTS_SLACK[0] * planned_host, HOST_WEIGHTS_SLACK[1])
        if actual.host_weights_bytes is not None and actual.host_weights_bytes > planned_host + slack:
            moved = actual.host_weights_bytes - planned_host
            out.append(Difference("host_weights", planned_host, actual.host_weights_bytes,
                                  f"{_size(actual.host_weights_bytes)} of weights in host memory, not the planned "
                                  f"{_size(planned_host)}"
                                  + (f" (GPU {_size(actual.gpu_weights_bytes)}, plan {_size(plan.gpu_weights_bytes)})"
                                     if actual.gpu_weights_bytes is not None and plan.gpu_weights_bytes else ""),
                                  f"every token reads {_size(moved)} more from host memory than planned, "
                                  "several times slower than the GPU's"))
        planned_gpu, got = plan.gpu_weights_bytes, actual.gpu_weights_bytes
        if planned_gpu and got is not None and got > max(WEIGHTS_OTHER_PRECISION[0] * planned_gpu,
                                                         planned_gpu + WEIGHTS_OTHER_PRECISION[1]):
            out.append(Difference("gpu_weights", planned_gpu, got,
                                  f"{_size(got)} of weights on the GPU, {got / planned_gpu:.1f}x the planned "
                                  f"{_size(planned_gpu)}: the pick's quantization was not what loaded",
                                  f"each token reads {_size(got - planned_gpu)} more weights than planned, and the "
                                  "KV cache has that much less room"))
        if actual.host_kv_bytes:
            out.append(Difference("host_kv", 0, actual.host_kv_bytes,
                                  f"{_size(actual.host_kv_bytes)} of KV cache in host memory, not on the GPU",
                                  "attention reads that cache from host memory at every token"))
    if plan.ctx_total and actual.ctx_total is not None and actual.ctx_total < plan.ctx_total:
        out.append(Difference("ctx_total", plan.ctx_total, actual.ctx_total,
                              f"a cache of {actual.ctx_total:,} tokens, not the planned {plan.ctx_total:,}",
                              f"the slots together hold {plan.ctx_total - actual.ctx_total:,} tokens fewer "
                              "than planned"))
    if plan.ctx_per_slot and actual.ctx_per_slot is not None and actual.ctx_per_slot < plan.ctx_per_slot:
        out.append(Difference("ctx_per_slot", plan.ctx_per_slot, actual.ctx_per_slot,
                              f"{actual.ctx_per_slot:,} tokens per slot, not the planned {plan.ctx_per_slot:,}",
                              f"a request longer than {actual.ctx_per_slot:,} tokens fails"))
    if plan.slots and actual.slots is not None and actual.slots < plan.slots:
        out.append(Difference("slots", plan.slots, actual.slots,
                              f"{actual.slots} slots, not the planned {plan.slots}",
                              f"only {actual.slots} requests run at once; the others wait"))
    return out


def sentence(engine: str, diffs: list[Difference], actual: Placement, *, accepted: bool = False) -> str:
    """One sentence naming every difference and its cost (and the engine's own reason, when it gave one)."""
    parts = "; ".join(f"{d.text} ({d.cost})" for d in diffs)
    why = f" — its own fitting said: {actual.engine_changes[0]}" if actual.engine_changes else ""
    if accepted:
        return (f"{engine} did not place this launch as planned: {parts}{why}; kept because --accept-placement "
                "was given.")
    return (f"{engine} did not place this launch as planned: {parts}{why}; stopped it (lower --ctx or --parallel, "
            "or pass --accept-placement to run it as the engine placed it).")


@dataclass(frozen=True)
class Check:
    """The placement verdict stored with a launch."""

    status: str                    # "as_planned" | "differs" | "accepted" | "unknown"
    detail: str
    planned: Placement | None = None
    actual: Placement | None = None
    diffs: list[Difference] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "detail": self.detail,
                "planned": self.planned.as_dict() if self.planned else None,
                "actual": self.actual.as_dict() if self.actual else None,
                "differences": [d.as_dict() for d in self.diffs]}


def check(engine: str, plan: Placement | None, actual: Placement | None, *, accept: bool = False) -> Check:
    """The verdict for one launch: as planned, differing (accepted or not), or unknown (and why)."""
    if plan is None:
        return Check("unknown", "no prediction to compare the engine's placement with", plan, actual)
    if actual is None:
        return Check("unknown", f"{engine} reported no placement in its log", plan, actual)
    diffs = differences(plan, actual)
    if not diffs:
        where = ("every layer on the GPU" if plan.device == "gpu" and actual.layers_total else
                 "the host" if plan.device == "cpu" else "the GPU")
        return Check("as_planned", f"as planned: {where}, {actual.ctx_total or plan.ctx_total:,}-token cache, "
                                   f"{actual.slots or plan.slots} slot(s)", plan, actual)
    return Check("accepted" if accept else "differs", sentence(engine, diffs, actual, accepted=accept),
                 plan, actual, diffs)


ON_HOST = ("layers", "host_weights", "host_kv")   # the differences that are a fall back to the CPU


def check_record(record: Mapping[str, Any] | None) -> tuple[str, str]:
    """bench's reading of a stored verdict: ("PASS" | "FAIL" | "SKIP", why). Layers, weights or KV
    in host memory where the plan had them on a GPU FAIL (accepted or not: the figures are not the
    plan's); a smaller context or fewer slots the user accepted PASS with the difference named."""
    if not isinstance(record, Mapping) or not record.get("status"):
        return "SKIP", "no placement check was stored with the launch"
    status, detail = str(record["status"]), str(record.get("detail") or "")
    if status == "as_planned":
        return "PASS", f"the engine placed the launch as planned ({detail.removeprefix('as planned: ')})"
    if status == "differs":
        return "FAIL", detail
    if status == "accepted":
        diffs = [d for d in record.get("differences") or () if isinstance(d, Mapping)]
        host = [d for d in diffs if d.get("what") in ON_HOST]
        if host:
            return "FAIL", "; ".join(str(d.get("text")) for d in host) + " (accepted with --accept-placement)"
        return "PASS", ("on the devices as planned; accepted with --accept-placement: "
                        + "; ".join(str(d.get("text")) for d in diffs))
    return "SKIP", detail or "the launch's placement is not known"
