"""A running ik_llama.cpp llama-server: telling it from mainline's, its log, /metrics, timings."""

from __future__ import annotations

import re

import httpx

from ...placement import Placement
from ..base import (
    UNKNOWN_FAILURE,
    Capabilities,
    DecodeWindow,
    EngineTimings,
    MeasuredComponent,
    MemoryReport,
    ServerInfo,
)
from ..llamacpp.server import FAILURE_PATTERNS as MAINLINE_FAILURES
from ..llamacpp.server import FULL_LENGTH_BODY, MiB, PlacementLines, placement_from_log
from ..llamacpp.server import METRIC_NAMES as MAINLINE_METRICS
from .discovery import ENGINE

# Log patterns -> why a start failed: the fork's own wordings first, then mainline's.
FAILURE_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"error: unknown argument|error: invalid parameter for argument|invalid cache type", "bad flag"),
    (r"unknown speculative decoding type", "bad flag"),
    *MAINLINE_FAILURES,
)


def classify_failure(log_text: str) -> str:
    lowered = log_text.lower()
    for pattern, label in FAILURE_PATTERNS:
        if re.search(pattern, lowered):
            return label
    return UNKNOWN_FAILURE


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
_GPU_BACKENDS = ("CUDA", "ROCm", "Metal", "Vulkan", "SYCL")


def _on_gpu(buft: str) -> bool:
    return buft.startswith(_GPU_BACKENDS) and "Host" not in buft


def memory_report(log_text: str) -> MemoryReport | None:
    """The buffers the fork logged, keyed as ``fit`` names its components (None: it logged none).

    On a GPU build, weights kept on the host become ``weights_embedding`` and the host compute
    buffer ``compute_host``, as fit has them. A relaunch logs again: the last start wins.
    """
    starts = [m.start() for m in re.finditer(r"llama_model_loader: loaded meta data", log_text)]
    text = log_text[starts[-1]:] if starts else log_text
    gpu = any(_on_gpu(m.group(1)) for m in _BUFFER_LINES[0][1].finditer(text))
    sizes: dict[str, float] = {}
    where: dict[str, str] = {}

    def add(name: str, mib: float, source: str) -> None:
        sizes[name] = sizes.get(name, 0.0) + mib
        where.setdefault(name, source)

    for kind, rx in _BUFFER_LINES:
        for m in rx.finditer(text):
            buft, mib = m.group(1), float(m.group(2))
            if kind == "model":
                name = "weights_embedding" if gpu and not _on_gpu(buft) else "weights"
                add(name, mib, f"log: {buft} model buffer")
            elif kind == "kv":
                add("kv_cache", mib, f"log: {buft} KV buffer")
            elif kind == "compute":
                add("compute_host" if gpu and not _on_gpu(buft) else "compute", mib, f"log: {buft} compute buffer")
            else:
                add("output", mib, f"log: {buft} output buffer")
    if not sizes:
        return None
    comps = tuple(MeasuredComponent(n, int(round(v * MiB)), where[n]) for n, v in sizes.items())
    return MemoryReport(components=comps, source="ik_llama.cpp llama-server buffer lines (default verbosity)",
                        device="cuda" if gpu else "cpu")


# --------------------------------------------------------------------------- probing
def _props_are_the_forks(props: object) -> bool:
    """The fork's /props: mainline's slot fields, no ``build_info``, and its own ``model_path`` /
    ``system_prompt`` keys (server.cpp handle_props)."""
    return (isinstance(props, dict) and "default_generation_settings" in props and "build_info" not in props
            and "system_prompt" in props and "model_path" in props)


def probe(url: str, timeout: float = 5.0, api_key: str | None = None) -> ServerInfo | None:
    """ServerInfo if ``url`` is ik_llama.cpp's llama-server, else None (mainline's included)."""
    from ... import net

    auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with net.client(url, timeout=timeout, headers=auth) as http:
            props_resp = http.get(f"{url}/props")
            if props_resp.status_code != 200:
                return None
            props = props_resp.json()
            if not _props_are_the_forks(props):
                return None
            health = http.get(f"{url}/health").json()
            if not isinstance(health, dict) or "slots_idle" not in health:
                return None      # the fork's /health reports idle / processing slots
            models_resp = http.get(f"{url}/v1/models")
            model_id = ""
            if models_resp.status_code == 200:
                data = models_resp.json().get("data") or []
                model_id = str(data[0].get("id", "")) if data else ""
    except (httpx.HTTPError, ValueError, AttributeError, TypeError, KeyError, IndexError):
        return None
    caps = props.get("chat_template_caps")
    caps = caps if isinstance(caps, dict) else {}
    tools = caps.get("supports_tool_calls", caps.get("supports_tools"))
    reasons = {}
    if tools is not None:
        reasons["tools"] = f"/props chat_template_caps.supports_tool_calls = {str(tools).lower()}"
    settings = props.get("default_generation_settings")
    settings = settings if isinstance(settings, dict) else {}
    modalities = props.get("modalities")
    modalities = modalities if isinstance(modalities, dict) else {}
    return ServerInfo(
        url=url, engine=ENGINE, engine_version="", model_id=model_id,
        n_ctx=props.get("n_ctx") or settings.get("n_ctx"), total_slots=props.get("total_slots"),
        chat_template=props.get("chat_template"),
        capabilities=Capabilities(
            tools=None if tools is None else bool(tools),
            tool_choice_required=None if tools is None else bool(tools),
            parallel_tool_calls=caps.get("supports_parallel_tool_calls"),
            json_schema=True, reasoning=None, vision=modalities.get("vision"), timings=True,
            full_length_body=dict(FULL_LENGTH_BODY),
            reasons={**reasons,
                     "json_schema": "the fork's llama-server converts response_format json_schema to a grammar",
                     "timings": "the fork's llama-server returns `timings` in each response",
                     "full_length": "the fork's llama-server accepts the ignore_eos sampling parameter"},
        ),
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
    from ...values import float_or_none, int_or_none

    if not isinstance(raw, dict) or not raw:
        return None
    return EngineTimings(
        decode_tokens=int_or_none(raw.get("predicted_n")),
        decode_ms=float_or_none(raw.get("predicted_ms")),
        decode_window=DecodeWindow.FIRST_TOKEN_FREE,
        prompt_tokens=int_or_none(raw.get("prompt_n")),
        prompt_ms=float_or_none(raw.get("prompt_ms")),
        cached_tokens=None,
        draft_tokens=int_or_none(raw.get("draft_n")),
        draft_accepted=int_or_none(raw.get("draft_n_accepted")),
        source="ik_llama.cpp llama-server timings: predicted_n over predicted_ms, first token free, "
               "prompt_n over prompt_ms (no cache_n)",
    )


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
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = METRIC_NAMES.get(sample.name) or METRIC_NAMES.get(family.name)
                if name is not None:
                    out[name] = float(sample.value)
    except ValueError:
        return {}
    return out

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
