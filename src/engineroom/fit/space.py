"""A kv_pool build with a fixed KV space (catalog ``kv_cache_space``: vLLM's CPU build,
VLLM_CPU_KVCACHE_SPACE): the pool is a set size, not a share of the device.
"""

from __future__ import annotations

from ..arch import ModelArch
from ..catalog import Catalog, Engine
from ..catalog.pool_schema import KvCacheSpace
from ..hardware import Rig
from ..units import gib  # memory in GiB, the one convention (units.py)
from .kv import pool_bytes_per_token
from .request import Component, FitRequest, GpuFit, Verdict


def fit_space(arch: ModelArch, req: FitRequest, rig: Rig, eng: Engine, ks: KvCacheSpace, frac: float, w: int,
              w_src: str, act: int, coef: float, kv_need: int, kv_note: str, kv_fixed: int,
              draft: int, catalog: Catalog | None) -> tuple[list[GpuFit], list[Component], list[str], dict]:
    """A kv_pool build with a fixed KV space (catalog ``kv_cache_space``; vLLM's CPU build):
    RAM holds weights + the runtime + activations, and a KV pool of exactly the space (the
    user's ``req.kv_space_bytes``, else the build's ``default_gib``); the pool holds whole
    blocks of ``block_size`` tokens, each ``block_size x KV bytes per token``, after the
    sequences' recurrent state. With no default the build sizes the pool itself:
    ``frac x RAM`` less weights, runtime and activations (no CUDA graphs)."""
    cap = rig.cpu_ram_bytes or 0
    runtime = int(ks.runtime_gib * (1 << 30))
    fixed = [Component("weights", w, w_src),
             Component("activations", act, f"{coef:g} x 48 x ctx"),
             Component("runtime", runtime, f"{ks.runtime_gib:g} GiB process beside the weights (catalog "
                                           f"kv_cache_space.runtime_gib; no CUDA graphs on this build)")]
    if draft:
        fixed.append(Component("draft", draft, "draft model"))
    fixed_bytes = sum(c.bytes for c in fixed)
    unit = ks.unit_bytes
    if req.kv_space_bytes is not None:
        space, how = int(req.kv_space_bytes), f"{ks.env}={req.kv_space_bytes / unit:g} GiB (set)"
    elif ks.default_gib is not None:
        space, how = int(ks.default_gib * unit), f"{ks.env}={ks.default_gib:g} GiB (its default when unset)"
    else:
        space = int(frac * cap) - fixed_bytes
        how = (f"{ks.env} unset: {frac} x RAM - weights - runtime - activations = {gib(max(space, 0), 2)}")
    block = ks.block_size
    per_tok = pool_bytes_per_token(arch, req, catalog)
    block_bytes = block * per_tok
    kv_room = max(space - kv_fixed, 0)
    cap_blocks = kv_room // block_bytes
    cap_tokens = cap_blocks * block
    per_seq = kv_need // req.parallel
    seq_blocks = -(-per_seq // block_bytes) if per_seq else 0
    need_blocks = seq_blocks * req.parallel
    kv_blocked = need_blocks * block_bytes
    comps = list(fixed) + [Component("kv_cache", kv_blocked,
                                     f"{kv_note}, in {block}-token blocks "
                                     f"({need_blocks:,} blocks of {block_bytes:,} B) of the pool {how}")]
    if kv_fixed:
        comps.append(Component("recurrent_state", kv_fixed, f"{req.parallel} seq(s) of linear-attention state, "
                                                            f"taken from the KV pool"))
    spare = space - kv_blocked - kv_fixed
    if spare > 0:
        comps.append(Component("kv_pool_spare", spare, f"rest of the pool ({how})"))
    info = {"space": {"space": space, "how": how, "env": ks.env, "unit": unit, "cap": cap, "fixed": fixed_bytes,
                      "need_blocks": need_blocks, "cap_blocks": cap_blocks, "cap_tokens": cap_tokens,
                      "block": block, "per_tok": per_tok, "state": kv_fixed, "set": req.kv_space_bytes is not None
                      or ks.default_gib is not None}}
    notes = [f"{eng.id}'s {eng.backend or ''} build keeps its KV cache in a fixed pool: {how}; "
             f"{block}-token blocks of {block_bytes:,} B ({per_tok:,} B per token)"]
    if req.vision and arch.vision is not None:
        notes.append("the vision tower is part of the checkpoint's weights")
    return [GpuFit(0, cap, tuple(comps))], [], notes, info


def space_verdict(info: dict, req: FitRequest) -> tuple[Verdict, str]:
    """Verdict and binding sentence of a fixed-space pool (``fit_space``)."""
    sp = info["space"]
    env, unit, block, per_tok = sp["env"], sp["unit"], sp["block"], sp["per_tok"]
    need_bytes_ = sp["need_blocks"] * block * per_tok + sp["state"]
    need_units = -(-need_bytes_ // unit)
    pool_txt = (f"{env}={sp['space'] / unit:g} GiB" if sp["set"] else sp["how"])
    holds = f"{pool_txt} holds {sp['cap_tokens']:,} tokens ({sp['cap_blocks']:,} blocks of {block})"
    if sp["state"]:
        holds += f" beside {gib(sp['state'], 2)} of recurrent state"
    total = sp["fixed"] + max(sp["space"], 0)
    if sp["space"] <= sp["state"] or (sp["cap_blocks"] <= 0 and sp["need_blocks"]):
        return Verdict.DOES_NOT_FIT, (f"RAM: {holds}; ctx x parallel {req.ctx:,} x {req.parallel} "
                                     f"needs {env}={need_units} GiB")
    if sp["need_blocks"] > sp["cap_blocks"]:
        room = sp["cap"] - sp["fixed"]
        fits_ram = need_units * unit <= room
        return Verdict.DOES_NOT_FIT, (f"RAM: {holds} < ctx x parallel {req.ctx:,} x {req.parallel} "
                                f"({sp['need_blocks']:,} blocks); raise it to {env}={need_units} GiB "
                                + ("" if fits_ram else f"(more than the {gib(max(room, 0), 2)} RAM left beside "
                                                       "the weights and runtime) ")
                                + "or lower the context / sequences")
    if total > sp["cap"]:
        return Verdict.DOES_NOT_FIT, (f"RAM: weights + runtime + activations {gib(sp['fixed'], 2)} + {pool_txt} = "
                                f"{gib(total, 2)} > {gib(sp['cap'], 2)}")
    frac = (sp["cap"] - total) / sp["cap"] if sp["cap"] else 0
    verdict = Verdict.TIGHT if frac < 0.05 else Verdict.FITS
    return verdict, (f"RAM: {holds}; ctx x parallel {req.ctx:,} x {req.parallel} uses {sp['need_blocks']:,}; "
                     f"{gib(total, 2)} of {gib(sp['cap'], 2)} ({frac * 100:.1f}% headroom)")
