"""A running llama-server: health, failure patterns, the memory it logs, /props, its per-response timings."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import httpx

from ...placement import Placement
from ..base import (
    Capabilities,
    DecodeWindow,
    EngineTimings,
    HealthState,
    MeasuredComponent,
    MemoryReport,
    ServerInfo,
)
from ..running import PROBE_ERRORS, bearer, failure_reason, health_from, prometheus_samples, served_model_id
from .discovery import ENGINE


def health_state(status_code: int | None) -> HealthState:
    """llama-server answers 503 while loading and 200 when ready; no answer yet = still starting."""
    return health_from(status_code, {200: HealthState.READY, 503: HealthState.LOADING}, silent=HealthState.STARTING)


# Log patterns -> the reason a start failed, most specific first.
FAILURE_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"out of memory|failed to allocate|cudaMalloc failed|unable to allocate|std::bad_alloc", "out of memory"),
    (r"invalid argument|unknown argument|error: (?:invalid|unrecognized) |error while handling argument", "bad flag"),
    (r"unknown model architecture|unsupported model|unknown architecture", "unsupported model"),
    (r"failed to read magic|invalid magic|not a gguf|failed to load model|error loading model",
     "model file could not be loaded"),
    (r"couldn't bind|address already in use|bind\(\) failed", "port already in use"),
    (r"n_seq_max must be <= \d+", "more sequences (--parallel) than llama.cpp serves at once"),
    (r"error while loading shared libraries|cannot open shared object", "missing shared library"),
)


def classify_failure(log_text: str) -> str:
    return failure_reason(log_text, FAILURE_PATTERNS)


# --------------------------------------------------------------------------- memory it reports
MiB = 1024 * 1024
# llama-server -lv 4 prints each buffer once it allocates it (sizes as %.2f MiB)
_BUFFER_LINES = (
    ("model", re.compile(r"load_tensors:\s+(\S+) model buffer size =\s+([\d.]+) MiB")),
    ("kv", re.compile(r"llama_kv_cache:\s+(\S+) KV buffer size =\s+([\d.]+) MiB")),
    ("rs", re.compile(r"llama_memory_recurrent: size =.*R \((\w+)\):\s+([\d.]+) MiB, S \(\w+\):\s+([\d.]+) MiB")),
    ("compute", re.compile(r"sched_reserve:\s+(\S+) compute buffer size =\s+([\d.]+) MiB")),
    ("output", re.compile(r"llama_context:\s+(\S+)\s+output buffer size =\s+([\d.]+) MiB")),
)
# common_memory_breakdown_print: | - Host | 200 = 92 + 90 + 18 |  (self = model + context + compute, MiB);
# a GPU row reads | - CUDA0 (name) | total free self model context compute unaccounted |
_BREAKDOWN = re.compile(r"memory_breakdown_print:\s*\|\s*-\s*(?P<dev>[^|]+?)\s*\|(?P<nums>[^|]*)\|")


GPU_BACKENDS = ("CUDA", "ROCm", "Metal", "Vulkan", "SYCL")   # buffer-type prefixes of GPU backends


def on_gpu(buft: str) -> bool:
    """A buffer type in device memory (CUDA0, ROCm0, ...), not a host-pinned one (CUDA_Host)."""
    return buft.startswith(GPU_BACKENDS) and "Host" not in buft


def _weights_name(buft: str) -> str:
    if on_gpu(buft):
        return "weights"
    return {"CPU_REPACK": "weights_repack", "AMX": "weights_amx"}.get(buft, "weights")


def buffer_components(log_text: str, buffer_lines: Sequence[tuple[str, re.Pattern[str]]], *, gpu: bool,
                      weights_name: Callable[[str], str]) -> list[MeasuredComponent]:
    """The buffers a llama.cpp-family server logged, one component a name as ``fit`` has them (MiB
    summed, the first line's source kept): ``buffer_lines`` the engine's (kind, pattern; group 1 the
    buffer type, group 2 its MiB), ``weights_name`` names a model buffer by its type; on a GPU build
    (``gpu``) a compute buffer in host memory is ``compute_host``."""
    sizes: dict[str, float] = {}
    where: dict[str, str] = {}

    def add(name: str, mib: float, source: str) -> None:
        sizes[name] = sizes.get(name, 0.0) + mib
        where.setdefault(name, source)

    for kind, rx in buffer_lines:
        for m in rx.finditer(log_text):
            buft, mib = m.group(1), float(m.group(2))
            if kind == "model":
                add(weights_name(buft), mib, f"log: {buft} model buffer")
            elif kind == "kv":
                add("kv_cache", mib, f"log: {buft} KV buffer")
            elif kind == "rs":
                add("recurrent_state", mib + float(m.group(3)), "log: llama_memory_recurrent R + S")
            elif kind == "compute":
                add("compute_host" if gpu and not on_gpu(buft) else "compute", mib, f"log: {buft} compute buffer")
            else:
                add("output", mib, f"log: {buft} output buffer")
    return [MeasuredComponent(n, int(round(v * MiB)), where[n]) for n, v in sizes.items()]


def memory_report(log_text: str) -> MemoryReport | None:
    """The buffers llama-server logged (``-lv 4``), keyed as ``fit`` names its components.

    On a GPU build, weights kept on the host (the token embeddings, ``CPU_Mapped``) become
    ``weights_embedding`` and the host compute buffer ``compute_host``, as fit has them. The
    memory breakdown table llama.cpp prints (at start and at exit: the last one wins) gives
    each device's total as ``total:<device>`` (whole MiB: that table rounds).
    """
    gpu = any(m.group(1).startswith(GPU_BACKENDS) for m in _BUFFER_LINES[0][1].finditer(log_text))

    def weights_name(buft: str) -> str:
        name = _weights_name(buft)
        return "weights_embedding" if gpu and name == "weights" and not buft.startswith(GPU_BACKENDS) else name

    comps = buffer_components(log_text, _BUFFER_LINES, gpu=gpu, weights_name=weights_name)
    if not comps:
        return None
    totals: dict[str, int] = {}
    for m in _BREAKDOWN.finditer(log_text):
        nums = [int(x) for x in re.findall(r"\d+", m.group("nums"))]
        if not nums:
            continue
        # Host rows carry self = model + context + compute; device rows total, free, then the same
        self_mib = nums[0] if len(nums) <= 4 else nums[2]
        totals[m.group("dev").split(" (")[0]] = self_mib * MiB
    comps += [MeasuredComponent(f"total:{dev}", b, "log: memory breakdown table (whole MiB)")
              for dev, b in totals.items()]
    return MemoryReport(components=tuple(comps), source="llama-server -lv 4 buffer lines and its memory breakdown",
                        device="cuda" if gpu else "cpu")


# --------------------------------------------------------------------------- where it put things
@dataclass(frozen=True)
class PlacementLines:
    """The log lines a llama.cpp-family server states its placement in (each group 1: the value)."""

    load_start: re.Pattern[str]       # the real load begins here (the last one: a fit dry run or crash comes first)
    model_buffer: re.Pattern[str]     # (buffer type, MiB)
    kv_buffer: re.Pattern[str]        # (buffer type, MiB)
    layers: re.Pattern[str]           # (on GPU, total)
    n_ctx: re.Pattern[str]
    n_seq_max: re.Pattern[str] | None
    slots: re.Pattern[str]
    slot_ctx: re.Pattern[str]
    changes: re.Pattern[str] | None   # the engine's own fitting saying what it changed
    source: str


PLACEMENT_LINES = PlacementLines(
    load_start=re.compile(r"llama_model_loader: loaded meta data"),
    model_buffer=_BUFFER_LINES[0][1],
    kv_buffer=_BUFFER_LINES[1][1],
    layers=re.compile(r"load_tensors: offloaded (\d+)/(\d+) layers to GPU"),
    n_ctx=re.compile(r"llama_context: n_ctx\s+=\s+(\d+)"),
    n_seq_max=re.compile(r"llama_context: n_seq_max\s+=\s+(\d+)"),
    slots=re.compile(r"initializing, n_slots = (\d+)"),
    slot_ctx=re.compile(r"initializing, n_slots = \d+, n_ctx_slot = (\d+)"),
    # common/fit.cpp (b11434): what -fit (on by default) changed, or why it had to
    changes=re.compile(r"common_params_fit_impl: ((?:cannot meet free memory target|context size reduced"
                       r"|with only dense weights|\s*- \S+ .*\d+ layers \(\s*\d+ overflowing\)).*)"),
    source="llama-server log: load_tensors offloaded/buffer lines, llama_context n_ctx and n_seq_max, "
           "the server's n_slots and n_ctx_slot, common_params_fit_impl",
)


def placement_from_log(log_text: str, lines: PlacementLines) -> Placement | None:
    """Where a llama.cpp-family server put the model, from its log (None: it logged no load)."""
    starts = [m.start() for m in lines.load_start.finditer(log_text)]
    before, text = (log_text[:starts[-1]], log_text[starts[-1]:]) if starts else ("", log_text)
    bufs = [(m.group(1), float(m.group(2))) for m in lines.model_buffer.finditer(text)]
    if not bufs:
        return None
    gpu = any(b.startswith(GPU_BACKENDS) for b, _ in bufs)
    host_w = sum(mib for b, mib in bufs if not on_gpu(b))     # mapped, pinned, repacked: all host memory
    gpu_w = sum(mib for b, mib in bufs if on_gpu(b))
    host_kv = sum(float(m.group(2)) for m in lines.kv_buffer.finditer(text) if not on_gpu(m.group(1)))
    layers = lines.layers.search(text)

    def first(rx: re.Pattern[str] | None) -> int | None:
        m = rx.search(text) if rx is not None else None
        return int(m.group(1)) if m else None

    changes = tuple(m.group(1).strip() for m in lines.changes.finditer(before + text)) if lines.changes else ()
    return Placement(
        device="gpu" if gpu else "cpu",
        layers_on_gpu=int(layers.group(1)) if layers else None,
        layers_total=int(layers.group(2)) if layers else None,
        gpu_weights_bytes=int(round(gpu_w * MiB)) if gpu else None,
        host_weights_bytes=int(round(host_w * MiB)),
        host_kv_bytes=int(round(host_kv * MiB)) if gpu else None,
        ctx_total=first(lines.n_ctx), ctx_per_slot=first(lines.slot_ctx),
        slots=first(lines.n_seq_max) or first(lines.slots),
        engine_changes=changes, source=lines.source,
    )


def placement_report(log_text: str) -> Placement | None:
    """Where llama-server put the model: layers offloaded, weights and KV per side, context and slots."""
    return placement_from_log(log_text, PLACEMENT_LINES)


# --------------------------------------------------------------------------- probing
def props_answer(http: httpx.Client, url: str) -> object:
    """What a llama.cpp-family server's ``/props`` answers (None: another status)."""
    resp = http.get(f"{url}/props")
    return resp.json() if resp.status_code == 200 else None


def generation_settings(props: dict) -> dict:
    """The ``default_generation_settings`` object of a llama.cpp-family ``/props`` ({} when absent)."""
    settings = props.get("default_generation_settings")
    return settings if isinstance(settings, dict) else {}


def props_capabilities(props: dict, server: str) -> Capabilities:
    """What a llama.cpp-family ``/props`` declares: tool calls by its chat template's caps, vision by
    its modalities; json_schema, timings and ignore_eos, which every such ``server`` (named so in the
    reasons) takes."""
    caps = props.get("chat_template_caps")
    caps = caps if isinstance(caps, dict) else {}
    tools = caps.get("supports_tool_calls", caps.get("supports_tools"))
    reasons = {}
    if tools is not None:
        reasons["tools"] = f"/props chat_template_caps.supports_tool_calls = {str(tools).lower()}"
    modalities = props.get("modalities")
    modalities = modalities if isinstance(modalities, dict) else {}
    return Capabilities(
        tools=None if tools is None else bool(tools),
        tool_choice_required=None if tools is None else bool(tools),
        parallel_tool_calls=caps.get("supports_parallel_tool_calls"),
        json_schema=True,       # llama-server turns json_schema into a grammar
        reasoning=None,
        vision=modalities.get("vision"),
        timings=True,
        full_length_body=dict(FULL_LENGTH_BODY),
        reasons={**reasons,
                 "json_schema": f"{server} converts response_format json_schema to a grammar",
                 "timings": f"{server} returns `timings` in each response",
                 "full_length": f"{server} accepts the ignore_eos sampling parameter"},
    )


def probe(url: str, timeout: float = 5.0, api_key: str | None = None) -> ServerInfo | None:
    """Return ServerInfo if ``url`` is a llama.cpp-family server (it answers ``/props``), else None."""
    from ... import net

    try:   # a server with a key guards /props; loopback: no proxy
        with net.client(url, timeout=timeout, headers=bearer(api_key)) as http:
            props = props_answer(http, url)
            if not isinstance(props, dict) or "default_generation_settings" not in props and "total_slots" not in props:
                return None
            if "build_info" not in props:
                return None   # mainline's /props always names its build; a fork's that does not is its own adapter's
            model_id = served_model_id(http, url)
    except PROBE_ERRORS:
        return None   # not a llama.cpp-shaped answer: another adapter (or "unknown") takes it
    return ServerInfo(
        url=url,
        engine=ENGINE,
        engine_version=str(props.get("build_info", "")),
        model_id=model_id,
        n_ctx=generation_settings(props).get("n_ctx") or props.get("n_ctx"),
        total_slots=props.get("total_slots"),
        chat_template=props.get("chat_template"),
        capabilities=props_capabilities(props, "llama-server"),
        extra={"props_keys": sorted(props),
               **({"model_path": str(props["model_path"])} if props.get("model_path") else {})},
        normalise_timings=normalise_timings,
    )




# --------------------------------------------------------------------------- request timings
# What a bench request carries to generate exactly max_tokens: the end-of-sequence token is
# not allowed to stop it (a sampling parameter of llama-server's /v1/chat/completions).
FULL_LENGTH_BODY: dict[str, object] = {"ignore_eos": True}


# the top-level field of a chat answer (and of the last stream chunk) that holds llama-server's
# per-response timings: the client keeps it among the answer's engine fields, this adapter reads it
TIMINGS_FIELD = "timings"


def normalise_timings(raw: dict[str, object] | None) -> EngineTimings | None:
    """llama-server's per-response ``timings`` block in engine-neutral fields (None when it sent none).

    b11434's ``server_slot_stats::to_json`` (tools/server/server-common.cpp): ``predicted_n``
    tokens generated over ``predicted_ms`` = last token - end of prompt processing, and
    ``predicted_per_second`` = (predicted_n - 1) / predicted_ms, because "the first token is
    free, it comes from the logits of the last prompt batch" (server-common.h); ``prompt_n``
    prompt tokens evaluated in ``prompt_ms``, ``cache_n`` reused from the slot's cache,
    ``draft_n`` / ``draft_n_accepted`` with speculative decoding. The rates themselves are not
    kept: the statistics recompute them from counts and windows.
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
        cached_tokens=int_or_none(raw.get("cache_n")),
        draft_tokens=int_or_none(raw.get("draft_n")),
        draft_accepted=int_or_none(raw.get("draft_n_accepted")),
        source="llama-server timings: predicted_n over predicted_ms, first token free "
               "(its predicted_per_second), prompt_n over prompt_ms",
    )


# --------------------------------------------------------------------------- /metrics
# llama-server's Prometheus counters (--metrics) -> engineroom's neutral names
METRIC_NAMES = {
    "llamacpp:prompt_tokens_total": "prompt_tokens_total",
    "llamacpp:prompt_tokens_cached_total": "prompt_cached_tokens_total",
    "llamacpp:prompt_seconds_total": "prompt_seconds_total",
    "llamacpp:tokens_predicted_total": "generated_tokens_total",
    "llamacpp:tokens_predicted_seconds_total": "generated_seconds_total",
    "llamacpp:n_decode_total": "decode_calls_total",
    "llamacpp:spec_decode_num_draft_tokens_total": "spec_drafted_tokens_total",
    "llamacpp:spec_decode_num_accepted_tokens_total": "spec_accepted_tokens_total",
    "llamacpp:spec_decode_num_drafts_total": "spec_drafts_total",
    "llamacpp:requests_processing": "requests_running",
    "llamacpp:requests_deferred": "requests_waiting",
}


def count_tokens(url: str, text: str, api_key: str | None = None, timeout: float = 30.0) -> int | None:
    """How many tokens llama-server's own tokenizer makes of ``text`` (``POST /tokenize``, no
    special tokens added); None when it answers anything but a token list."""
    from ... import net

    with net.client(url, timeout=timeout, headers=bearer(api_key)) as http:   # loopback: no proxy
        resp = http.post(f"{url.rstrip('/')}/tokenize", json={"content": text, "add_special": False})
    if resp.status_code != 200:
        return None
    try:
        tokens = resp.json().get("tokens")
    except (ValueError, AttributeError):
        return None
    return len(tokens) if isinstance(tokens, list) else None


SLOTS_PATH = "/slots"          # llama-server's slot listing (on unless --no-slots): one object per slot


def busy_slots(payload: object) -> int | None:
    """How many slots of llama-server's ``/slots`` answer are processing a task (``is_processing``)."""
    if not isinstance(payload, list) or not all(isinstance(slot, dict) for slot in payload):
        return None
    return sum(1 for slot in payload if slot.get("is_processing"))


def metrics_named(text: str, names: Mapping[str, str]) -> dict[str, float]:
    """A llama.cpp-family /metrics page (Prometheus text, one sample a name) in engineroom's neutral
    names: ``names`` maps the engine's sample or family name to one; others are left out, so a newer
    build's extra counters change nothing. An unreadable page: {}."""
    out: dict[str, float] = {}
    for sample, family, value in prometheus_samples(text) or ():
        name = names.get(sample) or names.get(family)
        if name is not None:
            out[name] = value
    return out


def normalise_metrics(text: str) -> dict[str, float]:
    """llama-server's /metrics (Prometheus text) as engineroom's neutral counter names; names it
    does not know are left out, so a newer build's extra counters change nothing."""
    return metrics_named(text, METRIC_NAMES)
