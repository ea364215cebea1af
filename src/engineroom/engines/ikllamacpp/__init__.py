"""ik_llama.cpp's ``llama-server`` (the fork): building it, rendering its command line, reading its answers.

The fork shares llama.cpp's server design, so what behaves identically is imported from the
llama.cpp adapter (``FAMILY``: the adapter whose names this package may use); what differs lives
here: its build (the ``ik-llama-cpp-python`` sdist), its defaults (-np 1, flash attention on,
--jinja off), its KV types (q6_0, q8_KV), its flag set (checked against the binary's --help),
its log lines, /props, /health and /metrics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..llamacpp.command import (  # the fork takes the same flags and has the same prompt cache
    api_key_file_args,
    api_key_file_in,
    host_cache_change,
    rope_scaling_arg,
    rope_scaling_example,
    split_api_key,
)
from ..llamacpp.discovery import BUILD_TARGETS  # the fork's server is built as mainline's target
from ..llamacpp.server import TIMINGS_FIELD, health_state  # the fork sends the same timings field
from .command import (
    ENGINE_OPTIONS,
    HADAMARD_K,
    HADAMARD_V,
    JINJA,
    KV_CACHE_TYPES,
    LEGACY_DRAFT_MAX,
    LEGACY_MTP,
    MERGE_QKV,
    RUN_TIME_REPACK,
    SPEC_TYPE,
    SPLIT_MODES,
    check_binary_cpu,
    launch_settings,
    loads_refusal,
    render,
    repack_disabled,
    spec_type_args,
    tune_knobs,
)
from .discovery import (
    BINARY,
    ENGINE,
    ENV_BINARY,
    EXPECTED_BUILD,
    MANIFEST,
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
    write_build_info,
)
from .flags import known_flags, parse_help, validate_argv
from .prebuilt import EXPECTED_PREBUILT, install_prebuilt
from .server import (
    FAILURE_PATTERNS,
    METRIC_NAMES,
    classify_failure,
    memory_report,
    normalise_metrics,
    normalise_timings,
    placement_report,
    probe,
)

FAMILY = "llama.cpp"    # the adapter this one imports from: its OWN_NAMES may be used in this package
# the fork's own words, which no module outside this adapter may use (tests/test_adapters.py)
OWN_NAMES = (HADAMARD_K, HADAMARD_V, "--k-cache-hadamard", "--v-cache-hadamard", MERGE_QKV, "-mqkv",
             RUN_TIME_REPACK, "--run-time-repack", LEGACY_MTP, LEGACY_DRAFT_MAX, "q8_KV", "slots_idle",
             "slots_processing",
             "n_past", "llamacpp:kv_cache_usage_ratio", "llamacpp:kv_cache_tokens")

# how engineroom exercises it (README's engine table; `engineroom engines` shows it)
TESTED = ("real: up -> verify -> bench on its CPU build from the ik-llama-cpp-python 0.1.5 sdist, in CI on the "
          "wheel's kernels (--prebuilt; tests/test_ik_llamacpp.py, tests/test_bakeoff.py, SmolLM2-135M); flags "
          "checked against the binary's own --help; CUDA build not compiled")

__all__ = ["BINARY", "BUILD_TARGETS", "ENGINE", "ENV_BINARY", "EXPECTED_BUILD", "EXPECTED_PREBUILT", "FAILURE_PATTERNS",
           "FAMILY", "HADAMARD_K", "HADAMARD_V", "JINJA", "KV_CACHE_TYPES", "MANIFEST", "MERGE_QKV", "METRIC_NAMES",
           "OWN_NAMES", "ENGINE_OPTIONS", "LEGACY_DRAFT_MAX", "LEGACY_MTP",
           "RUN_TIME_REPACK", "SOURCE_PACKAGE", "SOURCE_VERSION", "SPEC_TYPE", "SPLIT_MODES",
           "TIMINGS_FIELD", "Binary",
           "api_key_file_args", "api_key_file_in", "binary_version", "check_binary_cpu", "classify_failure",
           "cmake_options", "find_binary", "host_cache_change", "health_state", "install", "install_prebuilt",
           "install_root", "installed",
           "known_flags",
           "launch_settings", "loads_refusal", "memory_report", "normalise_metrics", "normalise_timings",
           "placement_report",
           "parse_help", "placeholder_binary", "probe", "render", "repack_disabled", "rope_scaling_arg",
           "rope_scaling_example", "spec_type_args", "split_api_key", "tune_knobs", "validate_argv", "write_build_info"]


if TYPE_CHECKING:   # mypy checks this package against the adapter protocol and every optional hook it implements
    from typing import Protocol

    from .. import base as _base
    from .. import ikllamacpp as _self

    class _Implements(_base.EngineAdapter[Binary], _base.ChecksBinaryCpu[Binary], _base.FindsRopeScaling,
                      _base.ShowsRopeScaling, _base.Repacks, _base.SplitsApiKey, _base.FindsApiKeyFile,
                      _base.RefusesModels,
                      _base.ReportsMemory, _base.ReportsPlacement, _base.SettlesLaunch, _base.NormalisesMetrics,
                      _base.NormalisesTimings, _base.ListsInstalls, _base.Installs,
                      _base.InstallsPrebuilt,
                      _base.HasPlaceholderBinary[Binary], _base.TellsBinaryVersion[Binary],
                      _base.ValidatesArgv[Binary], Protocol):
        """The protocol and the hooks this adapter implements (engines/base.py)."""

    _conforms: _Implements = _self
