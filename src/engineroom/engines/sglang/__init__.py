"""SGLang (``python -m sglang.launch_server``): its environment, its command line, its answers.

Everything specific to SGLang lives here: the Python environment `engineroom engines install
sglang` makes (``engines/pyenv``), flag names and the catalog's KV / speculative names in
SGLang's words, the API-key shim (SGLang reads a key from its argv only), health semantics,
/get_model_info + /get_server_info, /metrics names, failure patterns, the multi-node recipe
(``render_cluster``) and the check of a rendered command line by SGLang's own parser
(``validate_argv``).

This package is the adapter (the ``engineroom.engines`` entry point ``sglang``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .command import (
                      API_KEY_FILE_FLAG,
                      API_KEY_FLAG,
                      CONV_DTYPE_ENV,
                      DEFAULT_PORT,
                      DIST_PORT,
                      KEY_SHIM,
                      KV_CACHE_DTYPES,
                      SGLANG_KV_DTYPES,
                      SPEC_ALGORITHMS,
                      activation_dtype,
                      api_key_file_in,
                      conv_state_env,
                      kv_cache_dtype,
                      launch_settings,
                      loads_refusal,
                      random_weights_loading,
                      render,
                      render_cluster,
                      server_args,
                      serving_model,
                      spec_algorithm,
                      spec_args,
                      split_api_key,
)
from .discovery import (
                      CPU_TORCH_INDEX,
                      ENGINE,
                      ENV_BINARY,
                      EXPECTED_BUILD,
                      MODULE,
                      PACKAGE,
                      RELEASE,
                      VERSION,
                      Binary,
                      binary_version,
                      find_binary,
                      install,
                      installed,
                      placeholder_binary,
)
from .server import (
                      FAILURE_PATTERNS,
                      FULL_LENGTH_BODY,
                      METRIC_MEANS,
                      METRIC_NAMES,
                      MODEL_INFO_PATH,
                      SERVER_INFO_PATH,
                      START_TIMEOUT_S,
                      classify_failure,
                      health_state,
                      memory_report,
                      normalise_metrics,
                      probe,
                      server_info,
                      wait_hint,
)
from .validate import validate_argv, validate_many, validation_report, validation_reports

# SGLang's own words — flags, endpoints, metric names — that no module outside this adapter may
# use (tests/test_adapters.py checks every string literal of src/ against them). Flags SGLang
# shares with other engines (--kv-cache-dtype, --served-model-name, --tool-call-parser,
# --default-chat-template-kwargs, the ignore_eos sampling parameter, ...) are
# not listed: another adapter may need them too.
OWN_NAMES = ("sglang.launch_server", "--model-path", "--context-length", "--max-running-requests", "--tp-size",
             "--pp-size", "--mem-fraction-static", "--enable-metrics", "--speculative-algorithm",
             "--speculative-draft-model-path", "--speculative-num-steps", "--speculative-eagle-topk",
             "--speculative-num-draft-tokens", "--dist-init-addr", "--skip-server-warmup", "--enable-multimodal",
             "get_model_info", "get_server_info", "is_generation", "has_image_understanding",
             *METRIC_NAMES, *METRIC_MEANS)

# how engineroom exercises it (README's engine table; `engineroom engines` shows it)
TESTED = ("parser-validated: every rendered command line (one node, each spec method, each node of a cluster, a "
          "random-weight folder's --load-format dummy) parsed by SGLang 0.5.23's own ServerArgs, that folder written "
          "in SGLang's environment (tests/test_sglang.py); no server run (its CPU engine needs a CPU sgl_kernel)")

__all__ = ["RELEASE",
           "API_KEY_FILE_FLAG", "API_KEY_FLAG", "CONV_DTYPE_ENV", "CPU_TORCH_INDEX", "DEFAULT_PORT", "DIST_PORT",
           "ENGINE", "ENV_BINARY",
           "EXPECTED_BUILD", "FAILURE_PATTERNS", "FULL_LENGTH_BODY", "KEY_SHIM", "KV_CACHE_DTYPES", "METRIC_MEANS",
           "METRIC_NAMES",
           "MODEL_INFO_PATH", "MODULE", "OWN_NAMES", "PACKAGE", "SERVER_INFO_PATH", "SGLANG_KV_DTYPES",
           "SPEC_ALGORITHMS", "START_TIMEOUT_S", "VERSION", "Binary", "activation_dtype", "api_key_file_in",
           "binary_version",
           "classify_failure", "conv_state_env",
           "find_binary", "health_state", "install", "installed", "kv_cache_dtype", "launch_settings",
           "loads_refusal", "memory_report", "random_weights_loading", "serving_model",
           "normalise_metrics", "placeholder_binary", "probe", "render", "render_cluster",
           "server_args", "server_info", "spec_algorithm", "spec_args", "split_api_key", "validate_argv",
           "validate_many", "validation_report", "validation_reports", "wait_hint"]


if TYPE_CHECKING:   # mypy checks this package against the adapter protocol and every optional hook it implements
    from typing import Protocol

    from .. import base as _base
    from .. import sglang as _self

    class _Implements(_base.EngineAdapter[Binary], _base.SplitsApiKey, _base.FindsApiKeyFile, _base.RefusesModels,
                      _base.SettlesLaunch, _base.NormalisesMetrics, _base.ListsInstalls, _base.Installs,
                      _base.HasPlaceholderBinary[Binary], _base.TellsBinaryVersion[Binary],
                      _base.ValidatesArgv[Binary], _base.RendersCluster[Binary], _base.ReportsMemory,
                      _base.ConvertsModel, _base.MakesRandomWeights, _base.HintsWhileWaiting, Protocol):
        """The protocol and the hooks this adapter implements (engines/base.py)."""

    _conforms: _Implements = _self
