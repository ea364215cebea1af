"""A running ik_llama.cpp llama-server: telling it from mainline's, its log, /metrics, timings."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TypeGuard

from ...placement import Placement
from ..base import EngineTimings, MemoryReport, ServerInfo
from ..llamacpp.server import FAILURE_PATTERNS as MAINLINE_FAILURES
from ..llamacpp.server import METRIC_NAMES as MAINLINE_METRICS
from ..llamacpp.server import (
    PlacementLines,
    buffer_components,
    generation_settings,
    metrics_named,
    on_gpu,
    placement_from_log,
    props_answer,
    props_capabilities,
)
from ..llamacpp.server import normalise_timings as mainline_timings
from ..running import PROBE_ERRORS, bearer, failure_reason, served_model_id
from .discovery import ENGINE

# Log patterns -> why a start failed: the fork's own wordings first, then mainline's.
FAILURE_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"error: unknown argument|error: invalid parameter for argument|invalid cache type", "bad flag"),
    (r"unknown speculative decoding type", "bad flag"),
    *MAINLINE_FAILURES,
)


def classify_failure(log_text: str) -> str:
    return failure_reason(log_text, FAILURE_PATTERNS)


# --------------------------------------------------------------------------- memory it reports
# The fork logs each buffer at its default verbosity (sizes as %.2f MiB), in the older wording:
#   llm_load_tensors:        CPU buffer size =   100.00 MiB
#   llama_kv_cache_init:        CPU KV buffer size =    90.00 MiB
#   llama_init_from_model:        CPU  output buffer size =     0.38 MiB
#   llama_init_from_model:        CPU compute buffer size =    97.13 MiB
_CTX = r"(?:llama_init_from_model|llama_new_context_with_model)"   # the 0.1.5 build's name, then the older one
_BUFFER_LINES = (
    ("model", re.compile(r"llm_load_tensors:\s+(\S+) buffer size =\s+([\d.]+) MiB")),
    ("kv", re.compile(r"llama_kv_cache_init:\s+(\S+) KV buffer size =\s+([\d.]+) MiB")),
    ("output", re.compile(rf"{_CTX}:\s+(\S+)\s+output buffer size =\s+([\d.]+) MiB")),
    ("compute", re.compile(rf"{_CTX}:\s+(\S+) compute buffer size =\s+([\d.]+) MiB")),
)


def memory_report(log_text: str) -> MemoryReport | None:
    """The buffers the fork logged, keyed as ``fit`` names its components (None: it logged none).

    On a GPU build, weights kept on the host become ``weights_embedding`` and the host compute
    buffer ``compute_host``, as fit has them. A relaunch logs again: the last start wins.
    """
    starts = [m.start() for m in re.finditer(r"llama_model_loader: loaded meta data", log_text)]
    text = log_text[starts[-1]:] if starts else log_text
    gpu = any(on_gpu(m.group(1)) for m in _BUFFER_LINES[0][1].finditer(text))
    comps = buffer_components(text, _BUFFER_LINES, gpu=gpu,
                              weights_name=lambda buft: "weights_embedding" if gpu and not on_gpu(buft) else "weights")
    if not comps:
        return None
    return MemoryReport(components=tuple(comps), source="ik_llama.cpp llama-server buffer lines (default verbosity)",
                        device="cuda" if gpu else "cpu")


# --------------------------------------------------------------------------- probing
def _props_are_the_forks(props: object) -> TypeGuard[dict]:
    """The fork's /props: mainline's slot fields, no ``build_info``, and its own ``model_path`` /
    ``system_prompt`` keys (server.cpp handle_props)."""
    return (isinstance(props, dict) and "default_generation_settings" in props and "build_info" not in props
            and "system_prompt" in props and "model_path" in props)


def probe(url: str, timeout: float = 5.0, api_key: str | None = None) -> ServerInfo | None:
    """ServerInfo if ``url`` is ik_llama.cpp's llama-server, else None (mainline's included)."""
    from ... import net

    try:
        with net.client(url, timeout=timeout, headers=bearer(api_key)) as http:
            props = props_answer(http, url)
            if not _props_are_the_forks(props):
                return None
            health = http.get(f"{url}/health").json()
            if not isinstance(health, dict) or "slots_idle" not in health:
                return None      # the fork's /health reports idle / processing slots
            model_id = served_model_id(http, url)
    except PROBE_ERRORS:
        return None
    return ServerInfo(
        url=url, engine=ENGINE, engine_version="", model_id=model_id,
        n_ctx=props.get("n_ctx") or generation_settings(props).get("n_ctx"), total_slots=props.get("total_slots"),
        chat_template=props.get("chat_template"),
        capabilities=props_capabilities(props, "the fork's llama-server"),
        extra={"props_keys": sorted(props), "health": {k: health[k] for k in ("slots_idle", "slots_processing")
                                                        if k in health}},
        normalise_timings=normalise_timings,
    )


# --------------------------------------------------------------------------- request timings
def normalise_timings(raw: dict[str, object] | None) -> EngineTimings | None:
    """The fork's per-response ``timings`` in engine-neutral fields (None when it sent none).

    server-context.cpp get_timings: ``predicted_n`` = n_decoded over ``predicted_ms`` from the
    first generated token (t_start_generation is set when n_decoded reaches 1: the first token
    is free), ``prompt_n`` over ``prompt_ms``; ``n_ctx`` / ``n_past`` instead of mainline's
    ``cache_n`` (no cached-token count), ``draft_n`` / ``draft_n_accepted`` when drafting.
    """
    timings = mainline_timings(raw)        # mainline's fields and window, less the cached-token count
    return None if timings is None else replace(
        timings, cached_tokens=None,
        source="ik_llama.cpp llama-server timings: predicted_n over predicted_ms, first token free, "
               "prompt_n over prompt_ms (no cache_n)")


# --------------------------------------------------------------------------- /metrics
# the fork's Prometheus names (--metrics): mainline's without the spec-decode counters, plus
# the KV cache's fill (gauges, not counters: bench takes deltas of *_total only)
METRIC_NAMES = {
    **{k: v for k, v in MAINLINE_METRICS.items() if "spec_decode" not in k},
    "llamacpp:kv_cache_usage_ratio": "kv_cache_usage_ratio",
    "llamacpp:kv_cache_tokens": "kv_cache_tokens",
}


def normalise_metrics(text: str) -> dict[str, float]:
    """The fork's /metrics as engineroom's neutral names; names it does not know are left out."""
    return metrics_named(text, METRIC_NAMES)

# --------------------------------------------------------------------------- where it put things
# The fork's wording (tests/fixtures/ik_llamacpp/server.log): "llm_load_tensors: offloaded N/M layers
# to GPU", "llama_init_from_model: n_ctx = N", "initializing slots | ... n_slots=N", "new slot | ...
# n_ctx_slot=N". Its --fit is off unless asked (its --help), so nothing refits what engineroom sized.
PLACEMENT_LINES = PlacementLines(
    load_start=re.compile(r"llama_model_loader: loaded meta data"),
    model_buffer=_BUFFER_LINES[0][1],
    kv_buffer=_BUFFER_LINES[1][1],
    layers=re.compile(r"llm_load_tensors: offloaded (\d+)/(\d+) layers to GPU"),
    n_ctx=re.compile(rf"{_CTX}: n_ctx\s+=\s+(\d+)"),
    n_seq_max=None,
    slots=re.compile(r"initializing slots\b.*?\bn_slots=(\d+)"),
    slot_ctx=re.compile(r"new slot\b.*?\bn_ctx_slot=(\d+)"),
    changes=None,
    source="ik_llama.cpp log: llm_load_tensors offloaded/buffer lines, llama_init_from_model n_ctx, the "
           "server's n_slots and n_ctx_slot",
)


def placement_report(log_text: str) -> Placement | None:
    """Where the fork put the model: layers offloaded, weights and KV per side, context and slots."""
    return placement_from_log(log_text, PLACEMENT_LINES)
