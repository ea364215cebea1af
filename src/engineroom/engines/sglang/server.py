"""A running SGLang server: health, failure patterns, /get_model_info + /get_server_info, /metrics.

Endpoint and metric names are SGLang 0.5.23's (``sglang/srt/entrypoints/http_server.py``,
``sglang/srt/observability/metrics_collector.py``).
"""

from __future__ import annotations

import re

from ..base import Capabilities, HealthState, MeasuredComponent, MemoryReport, ServerInfo
from ..running import (
    PROBE_ERRORS,
    bearer,
    failure_reason,
    health_from,
    last_log_line,
    prometheus_samples,
    served_model_id,
)
from .discovery import ENGINE

MODEL_INFO_PATH = "/get_model_info"
SERVER_INFO_PATH = "/get_server_info"      # deprecated alias of /server_info, still served by 0.5.23
SERVER_INFO_PATH_NEW = "/server_info"


def health_state(status_code: int | None) -> HealthState:
    """SGLang's /health: no answer while the HTTP server is not up yet (starting), 503 while the
    scheduler warms up (loading), 200 once a request would be served."""
    return health_from(status_code, {200: HealthState.READY, 503: HealthState.LOADING}, silent=HealthState.STARTING)


# Log patterns -> the reason a start failed, most specific first.
FAILURE_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"torch\.(?:cuda\.)?outofmemoryerror|cuda out of memory|out of memory|not enough memory|"
     r"kv cache pool.*(?:too small|insufficient)", "out of memory"),
    (r"error: unrecognized arguments|error: argument [^\n]*: invalid choice|error: argument [^\n]*expected|"
     r"error: the following arguments are required", "bad flag"),
    (r"no cuda gpus are available|found no nvidia driver|torch not compiled with cuda|"
     r"cuda driver initialization failed|nvidia-smi.*(?:not found|failed)|no accelerator", "no GPU"),
    (r"address already in use|errno 98", "port already in use"),
    # not SGLang's own notes on optional processors ("Ignore import error when loading ...: No module named ...")
    (r"(?m)^(?!.*ignore import error).*(?:modulenotfounderror|no module named|importerror)", "missing Python package"),
    (r"(?:model architectures?|architecture) \[?'?[\w]+'?\]? (?:are|is) not supported|"
     r"unsupported (?:model )?architecture", "unsupported model"),
    (r"does not appear to have a file named config\.json|can't load the configuration|can't load image processor|"
     r"repository not found|we couldn't connect to 'https://huggingface\.co'|offlinemodeisenabled|"
     r"is not a local folder and is not a valid model identifier", "model could not be loaded"),
    (r"requires setting --speculative-draft-model-path|speculative .* (?:not supported|unsupported)",
     "speculative decoding not possible with these settings"),
)


def classify_failure(log_text: str) -> str:
    return failure_reason(log_text, FAILURE_PATTERNS)


# --------------------------------------------------------------------------- probing
def probe(url: str, timeout: float = 5.0, api_key: str | None = None) -> ServerInfo | None:
    """ServerInfo if ``url`` is an SGLang server (its /get_model_info names a model path and
    whether it generates), else None. /get_server_info adds the version, context and parsers."""
    from ... import net

    url = url.rstrip("/")
    try:
        with net.client(url, timeout=timeout, headers=bearer(api_key)) as http:
            resp = http.get(f"{url}{MODEL_INFO_PATH}")
            if resp.status_code != 200:
                return None
            info = resp.json()
            if not isinstance(info, dict) or "model_path" not in info or "is_generation" not in info:
                return None
            server: dict = {}
            for path in (SERVER_INFO_PATH_NEW, SERVER_INFO_PATH):
                sresp = http.get(f"{url}{path}")
                if sresp.status_code == 200 and isinstance(sresp.json(), dict):
                    server = sresp.json()
                    break
            model_id = served_model_id(http, url)
    except PROBE_ERRORS:
        return None
    return server_info(url, info, server, model_id)


def server_info(url: str, info: dict, server: dict, model_id: str) -> ServerInfo:
    """ServerInfo from SGLang's /get_model_info and /get_server_info answers (split out to test)."""
    tool_parser = info.get("tool_call_parser") or server.get("tool_call_parser")
    reasoning_parser = info.get("reasoning_parser") or server.get("reasoning_parser")
    vision = info.get("has_image_understanding")
    n_ctx = server.get("context_length")
    slots = server.get("max_running_requests")
    reasons = {
        "tools": f"/get_model_info tool_call_parser = {tool_parser!r}" + ("" if tool_parser else
                 " (SGLang returns no structured tool calls without a parser)"),
        "reasoning": f"/get_model_info reasoning_parser = {reasoning_parser!r}",
        "json_schema": "SGLang turns response_format json_schema into a grammar (its grammar backend)",
        "tool_choice_required": "SGLang constrains tool_choice required/named with its grammar backend",
        "full_length": "SGLang's chat API accepts the ignore_eos sampling parameter",
    }
    if vision is not None:
        reasons["vision"] = f"/get_model_info has_image_understanding = {vision}"
    return ServerInfo(
        url=url,
        engine=ENGINE,
        engine_version=str(server.get("version", "")),
        model_id=model_id or str(info.get("served_model_name") or ""),
        n_ctx=n_ctx if isinstance(n_ctx, int) else None,
        total_slots=slots if isinstance(slots, int) else None,
        capabilities=Capabilities(
            tools=bool(tool_parser),
            tool_choice_required=bool(tool_parser),
            parallel_tool_calls=None,
            json_schema=True,
            reasoning=bool(reasoning_parser),
            vision=None if vision is None else bool(vision),
            timings=False,                    # no per-response timings block: /metrics only
            full_length_body=dict(FULL_LENGTH_BODY),
            reasons={**reasons, "timings": "SGLang's responses carry usage counts, no engine timings"},
        ),
        extra={"model_info_keys": sorted(info), "model_type": info.get("model_type"),
               "architectures": info.get("architectures")},
    )


# what a bench request carries to generate exactly max_tokens (a sampling parameter of SGLang's chat API)
FULL_LENGTH_BODY: dict[str, object] = {"ignore_eos": True}


# --------------------------------------------------------------------------- /metrics
# SGLang's Prometheus series (--enable-metrics) -> engineroom's neutral names. Counters carry
# labels (model_name, engine_type, tp_rank, pp_rank, is_streaming, ...): their samples are summed.
METRIC_NAMES = {
    "sglang:prompt_tokens_total": "prompt_tokens_total",
    "sglang:generation_tokens_total": "generated_tokens_total",
    "sglang:cached_tokens_total": "prompt_cached_tokens_total",
    "sglang:num_requests_total": "requests_total",
    "sglang:spec_verify_calls_total": "spec_verify_calls_total",
    "sglang:num_running_reqs": "requests_running",
    "sglang:num_queue_reqs": "requests_waiting",
    "sglang:time_to_first_token_seconds_sum": "ttft_seconds_sum",
    "sglang:time_to_first_token_seconds_count": "ttft_seconds_count",
    "sglang:inter_token_latency_seconds_sum": "inter_token_seconds_sum",
    "sglang:inter_token_latency_seconds_count": "inter_token_seconds_count",
    "sglang:e2e_request_latency_seconds_sum": "e2e_seconds_sum",
    "sglang:e2e_request_latency_seconds_count": "e2e_seconds_count",
}
# gauges that are ratios or means per scheduler: averaged over the ranks that report them
METRIC_MEANS = {
    "sglang:token_usage": "kv_cache_usage_ratio",
    "sglang:cache_hit_rate": "prefix_cache_hit_rate",
    "sglang:spec_accept_length": "spec_accept_length",
    "sglang:spec_accept_rate": "spec_accept_rate",
    "sglang:gen_throughput": "generated_tokens_per_second",
}


def normalise_metrics(text: str) -> dict[str, float]:
    """SGLang's /metrics (Prometheus text) as engineroom's neutral names; names it does not know
    are left out, so a newer release's extra series change nothing."""
    sums: dict[str, float] = {}
    means: dict[str, list[float]] = {}
    for name, _family, value in prometheus_samples(text) or ():       # an unreadable page: {}
        if name in METRIC_NAMES:
            key = METRIC_NAMES[name]
            sums[key] = sums.get(key, 0.0) + value
        elif name in METRIC_MEANS:
            means.setdefault(METRIC_MEANS[name], []).append(value)
    return {**sums, **{k: sum(v) / len(v) for k, v in means.items() if v}}


# --------------------------------------------------------------------------- what it logs while starting
# SGLang 0.5.16 on an H100 (tests/fixtures/sglang/h100_*.log): SmolLM2-135M ready 100 s after its first line (64 s
# of them capturing 58 prefill CUDA graphs); the Qwen3.6-27B layout at awq-int4 still in its first capture after
# 270 s, three times (2026-12-06). The default wait of 300 s is too short for a 27B start: 900 s, as vLLM's.
START_TIMEOUT_S = 900.0
_SKIP = re.compile(r"Warning|warnings\.warn|resource_tracker|Ignore import error|^\s*$")
_STAMP = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[^\]]*\]\s*")


def wait_hint(log_text: str) -> str | None:
    """The last meaningful log line (shown while the long start runs: loading, pools, CUDA-graph captures with
    their progress bars), without its time stamp, trimmed."""
    return last_log_line(log_text, _SKIP, _STAMP)


# --------------------------------------------------------------------------- memory it reports
# SGLang's scheduler logs (sglang/srt/model_executor/model_runner.py, mem_cache/memory_pool.py), each
# TP rank its own line, GB = 2**30 there; as 0.5.16 writes them (an H100, 2026-12-06:
# tests/fixtures/sglang/h100_*.log), and the older spellings:
#   "Load weight end. elapsed=9.21 s, type=..., avail mem=60.82 GB, mem usage=17.68 GB."             -> weights
#   "KV Cache is allocated. dtype: torch.float16, #tokens: 368379, K size: 11.24 GB, V size: 11.24 GB" -> kv_pool
#   "KV Cache is allocated. #tokens: 383872, KV size: 19.36 GB"                              -> kv_pool (MLA)
#   "Mamba Cache is allocated. max_mamba_cache_size: 140, conv_state size: 0.39GB, ssm_state size: 19.83GB"
#                                          -> kv_pool (a hybrid model's recurrent state: in SGLang's pool, as fit's)
#   "Capture target decode CUDA graph end. elapsed=2.64 s, mem usage=0.04 GB, avail mem=12.69 GB." -> cuda_graphs
#   "Capture cuda graph end. Time elapsed: 8.04 s. mem usage=0.80 GB. avail mem=10.30 GB."  -> cuda_graphs
GB = 1 << 30
_SG_WEIGHTS = re.compile(r"Load weight end\..*?mem usage=([\d.]+) ?GB")
_SG_KV = re.compile(r"KV Cache is allocated\.(?: dtype: [^,]+,)? #tokens: [\d,]+, (?:K size: ([\d.]+) ?GB, "
                    r"V size: ([\d.]+) ?GB|KV size: ([\d.]+) ?GB)")
_SG_STATE = re.compile(r"Mamba Cache is allocated\..*?conv_state size: ([\d.]+) ?GB, ssm_state size: ([\d.]+) ?GB")
_SG_GRAPHS = re.compile(r"Capture (?:cuda graph|target \w+ CUDA graph) end\..*?mem usage=([\d.]+) ?GB")


def memory_report(log_text: str) -> MemoryReport | None:
    """What SGLang logged allocating, keyed as fit names it: ``weights`` (each rank's ``Load weight
    end ... mem usage``), ``kv_pool`` (the KV cache it allocated, and a hybrid model's recurrent state
    beside it: fit's ``kv_cache`` + ``recurrent_state`` + ``kv_pool_spare``, which ``memory.compare``
    sums for it) and ``cuda_graphs`` (every capture: prefill and decode), summed over the TP ranks; GB
    to two decimals as SGLang prints them. None when it logged none of them."""
    comps: list[MeasuredComponent] = []
    weights = [float(m.group(1)) for m in _SG_WEIGHTS.finditer(log_text)]
    if weights:
        comps.append(MeasuredComponent("weights", int(round(sum(weights) * GB)),
                                       f"log: 'Load weight end ... mem usage' ({len(weights)} rank(s))"))
    kv = [sum(float(g) for g in m.groups() if g) for m in _SG_KV.finditer(log_text)]
    state = [float(m.group(1)) + float(m.group(2)) for m in _SG_STATE.finditer(log_text)]
    if kv or state:
        how = f"log: 'KV Cache is allocated' K + V sizes ({len(kv)} rank(s))"
        how += f" + 'Mamba Cache is allocated' conv + ssm state ({len(state)} rank(s))" if state else ""
        comps.append(MeasuredComponent("kv_pool", int(round((sum(kv) + sum(state)) * GB)), how))
    graphs = [float(m.group(1)) for m in _SG_GRAPHS.finditer(log_text)]
    if graphs:
        comps.append(MeasuredComponent("cuda_graphs", int(round(sum(graphs) * GB)),
                                       f"log: 'Capture ... CUDA graph end ... mem usage' ({len(graphs)} capture(s))"))
    if not comps:
        return None
    return MemoryReport(components=tuple(comps), source="SGLang's log: weights, KV cache, CUDA graphs per rank",
                        device="cuda")
