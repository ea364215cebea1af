"""The engine adapter seam, used by launch, checks, bench and flows: ``LaunchSpec`` (everything needed to
start an engine: argv, env, port, log path); ``ServerInfo`` (what a running OpenAI-compatible server told us
about itself; checks and bench receive one and never import an adapter or the launcher); ``Capabilities``
(declared by the server itself, e.g. llama.cpp's ``/props`` chat_template_caps: ``None`` "the server does not
say", ``False`` "declared absent", the only case in which a check may SKIP); the optional hooks."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from ..cpuprobe import CpuProbe
    from ..placement import Placement

UNKNOWN_FAILURE = "unknown (see the log lines above)"   # what classify_failure says when no pattern matched


@dataclass(frozen=True)
class LaunchSpec:
    engine: str
    argv: tuple[str, ...]
    port: int
    host: str = "127.0.0.1"
    env: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    model: str = ""                   # the model reference as the user gave it
    model_path: str = ""              # resolved file / dir
    health_path: str = "/health"
    engine_version: str = ""          # what the binary says of itself (`--version`)
    changes: tuple[dict, ...] = ()    # arguments engineroom added for this machine: {args, why, source}
    notes: tuple[str, ...] = ()       # what the adapter rendered beyond the options, and why (recipe prints them)
    # a multi-node recipe (render_cluster): the node this command runs on (0 = the head) and
    # what it is there for ("ray head", "rank 1", "serve"); a one-machine launch leaves both
    node: int = 0
    role: str = ""

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass(frozen=True)
class LaunchChange:
    """An argument engineroom added to the user's launch, and why (shown on the card)."""

    args: tuple[str, ...]
    why: str
    source: str                  # "cpu probe" | "relaunch after a crash" | "host memory"

    def as_dict(self) -> dict[str, object]:
        return {"args": list(self.args), "why": self.why, "source": self.source}


@dataclass(frozen=True)
class LaunchOptions:
    """What to launch, in engine-neutral words; an adapter's ``render`` turns it into its argv.

    ``None`` leaves a setting to the engine's own default, except where the adapter always
    passes it explicitly so that what runs is what was sized (llama.cpp's slots and unified
    KV). A plan's pick is a ``plan.LaunchRequest``; ``flows.picks.launch_options`` turns it into
    these; CLI flags replace its fields, so the plan and the user speak one vocabulary."""

    model_path: Path
    model_name: str = ""               # served model id (/v1/models), the user's name for it
    port: int = 8080
    host: str = "127.0.0.1"
    ctx: int | None = None             # tokens per sequence
    parallel: int | None = None          # concurrent sequences (slots / max sequences)
    kv_unified: bool | None = None     # one KV pool shared by all sequences (llama.cpp family)
    kv_dtype: str | None = None        # a catalog KV type id of the engine ("f16", "q8_0", "fp8")
    threads: int | None = None
    tp: int = 1                        # GPUs per instance
    chat_template: Path | None = None
    extra_args: tuple[str, ...] = ()   # the user's own engine arguments, passed last, verbatim
    changes: tuple[LaunchChange, ...] = ()
    log_path: Path | None = None
    api_key_file: Path | None = None   # a 0600 file holding the key: never the key itself
    # engine-neutral serving settings (None: the engine's default); each adapter translates them
    spec_method: str | None = None     # speculative decoding, a catalog spec method ("mtp", "eagle3", "ngram", ...)
    spec_tokens: int | None = None     # tokens drafted per step
    draft_model: str | None = None     # the drafter (path or repo) where the method needs one
    tool_parser: str | None = None     # the engine's tool-call parser name ("qwen3_coder")
    reasoning_parser: str | None = None
    mem_fraction: float | None = None  # share of device memory the engine may take (paged-KV engines)
    thinking: bool | None = None       # server-wide default for the chat template's thinking switch
    quant_format: str | None = None    # the weights' catalog format (gguf, autoround, awq, gptq, fp8, bf16 ...)
    vision: bool | None = None         # True: the vision tower served; False: text only (so sized); None: engine's way
    projector: Path | None = None      # the multimodal projector file (llama.cpp family) when vision is on
    engine_options: tuple[str, ...] = ()   # ids of options the adapter defines (its ENGINE_OPTIONS)


@dataclass(frozen=True)
class MeasuredComponent:
    """One memory component as the engine reported it, keyed like fit's components."""

    name: str            # "weights", "kv_cache", "compute", ... (fit's names)
    bytes: int
    source: str          # where it was read, e.g. "log: llama_kv_cache CPU KV buffer size"


@dataclass(frozen=True)
class MemoryReport:
    """The memory an engine says it allocated (its own log, NVML): what fit is checked against."""

    components: tuple[MeasuredComponent, ...]
    source: str                         # e.g. "llama-server -lv 4 buffer lines"
    device: str = "cpu"                 # "cpu" | "cuda" | ...
    gpu_used_bytes: int | None = None   # NVML: memory used by the engine's processes, when a GPU is present

    def component(self, name: str) -> int:
        return sum(c.bytes for c in self.components if c.name == name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.name for c in self.components))


class HealthState(StrEnum):
    """What one answer of the engine's health endpoint means (``health_state``). A StrEnum: each member
    equals its string, so states stored or compared as text ("ready", ...) keep working."""

    STARTING = "starting"     # nothing answers yet
    LOADING = "loading"       # the server answers but is still loading the model
    READY = "ready"
    ERROR = "error"


@runtime_checkable
class EngineBinary(Protocol):
    """What engineroom reads of an adapter's binary: the adapter's own type otherwise, handed
    back to its ``render`` (and the other hooks taking a binary) unread."""

    @property
    def path(self) -> Path: ...                 # the program (an interpreter for Python engines)

    @property
    def origin(self) -> str: ...                # where it was found ("--engine-bin", "PATH", ...)

    @property
    def env(self) -> dict[str, str]: ...        # environment it needs


BinaryT = TypeVar("BinaryT", bound=EngineBinary)
BinaryT_contra = TypeVar("BinaryT_contra", bound=EngineBinary, contravariant=True)   # hooks taking one
BinaryT_co = TypeVar("BinaryT_co", bound=EngineBinary, covariant=True)               # hooks making one


@runtime_checkable
class EngineAdapter(Protocol[BinaryT]):
    """What every engine adapter provides; engineroom knows engines only through this.

    An adapter is an object (a module works: engineroom's own are modules) registered under
    the ``engineroom.engines`` entry-point group. ``BinaryT`` is the adapter's own binary
    type: ``find_binary`` returns one and ``render`` takes it back.

    Beyond these members an adapter may implement any of the optional hooks below (one
    Protocol each, ``ReportsMemory`` ... ``ShipsCatalog``). Callers never reach a hook
    themselves: ``engines.Engine`` calls it where the adapter has it (an ``isinstance`` check
    against the hook's Protocol, so mypy checks the call) and supplies the documented neutral
    default where it has none, so a plugin that omits a hook still works. Engineroom's own
    adapters state the hooks they implement in a ``TYPE_CHECKING`` block at the end of their
    ``__init__``, which mypy checks against these Protocols.

    Data attributes an adapter may also set (read with their defaults by ``Engine``):
    ``START_TIMEOUT_S`` (float, 300), ``TESTED`` (str), ``TIMINGS_FIELD`` (str: the top-level
    response field holding its per-response timings, which its ``normalise_timings`` reads),
    ``OWN_NAMES`` (its flags and field names, kept out of the rest of engineroom), ``FAMILY``.
    """

    ENGINE: str                          # the catalog engine id, e.g. "llama.cpp"

    def find_binary(self, explicit: str | os.PathLike[str] | None = None) -> BinaryT:
        """The engine's program on this machine (raises NotFound with the install command)."""

    def render(self, binary: BinaryT, options: LaunchOptions) -> LaunchSpec:
        """The command line and environment for ``options``; nothing is started."""

    def health_state(self, status_code: int | None) -> HealthState:
        """The state one health-endpoint answer means (``None``: nothing answered)."""

    def classify_failure(self, log_text: str) -> str:
        """Why a start failed, from the engine's log: a short phrase shown to the user
        (UNKNOWN_FAILURE when no pattern matched). Free text, so a plain str."""

    def probe(self, url: str, timeout: float = 5.0, api_key: str | None = None) -> ServerInfo | None:
        """ServerInfo when the server at ``url`` is this engine's, else None. (An adapter that
        predates API keys may omit ``api_key``: it is passed only when a key is given.)"""


# --------------------------------------------------------------------------- optional hooks
# One Protocol per hook; the comment after each is the default ``engines.Engine`` supplies.
@runtime_checkable
class AdjustsForCpu(Protocol):           # default: no changes
    def cpu_adjustments(self, probe: CpuProbe, extra_args: Sequence[str] = ()) -> list[LaunchChange]: ...


@runtime_checkable
class CapsHostCache(Protocol):           # default: None (no host-RAM cache beyond what fit sizes)
    def host_cache_change(self, spare_bytes: int, extra_args: Sequence[str] = ()) -> LaunchChange | None: ...


@runtime_checkable
class FallsBackAfterCrash(Protocol):     # default: None (no relaunch)
    def crash_fallback(self, argv: Sequence[str], returncode: int) -> LaunchChange | None: ...


@runtime_checkable
class RelaunchesSpec(Protocol):          # default: the change's arguments appended to the argv
    def relaunch_spec(self, spec: LaunchSpec, change: LaunchChange) -> LaunchSpec: ...


@runtime_checkable
class ChecksBinaryCpu(Protocol[BinaryT_contra]):   # default: {}
    def check_binary_cpu(self, binary: BinaryT_contra, probe: CpuProbe) -> dict[str, object]: ...


@runtime_checkable
class FindsRopeScaling(Protocol):        # default: None
    def rope_scaling_arg(self, args: Sequence[str]) -> str | None: ...


@runtime_checkable
class ShowsRopeScaling(Protocol):        # default: a neutral sentence
    def rope_scaling_example(self, factor: int) -> str: ...


@runtime_checkable
class Repacks(Protocol):                 # default: False
    def repack_disabled(self, args: Sequence[str]) -> bool: ...


@runtime_checkable
class SplitsApiKey(Protocol):            # default: the args unchanged, no key, no key file
    def split_api_key(self, args: Sequence[str]) -> tuple[list[str], str | None, str | None]: ...


@runtime_checkable
class FindsApiKeyFile(Protocol):         # default: None
    def api_key_file_in(self, argv: Sequence[str]) -> str | None: ...


@runtime_checkable
class RefusesModels(Protocol):           # default: None (no refusal known)
    def loads_refusal(self, path: Path) -> str | None: ...


@runtime_checkable
class HintsWhileWaiting(Protocol):       # default: None
    def wait_hint(self, log_text: str) -> str | None: ...


@runtime_checkable
class ReportsMemory(Protocol):           # default: None (the engine says nothing)
    def memory_report(self, log_text: str) -> MemoryReport | None: ...


@runtime_checkable
class ReportsPlacement(Protocol):        # default: None (`up` records the placement as unknown)
    def placement_report(self, log_text: str) -> Placement | None: ...


@dataclass(frozen=True)
class Settled:
    """What a launch runs with once the engine's own defaults are filled in, in fit's words: what the
    memory prediction is made for (``SettlesLaunch``). ``None`` ctx: the engine picks one the
    adapter cannot tell (no trained context known)."""

    ctx: int | None
    parallel: int = 1
    kv_unified: bool = False
    kv_dtype: str | None = None        # a catalog KV type id (None: the engine's default)
    tp: int = 1
    repack: bool = True                # llama.cpp family: weights repacked for the CPU's kernels
    rope_scaling: str | None = None    # the RoPE scaling the user's arguments give ("yarn:4")
    quant: str | None = None           # the weights as the engine loads them, where it says (vLLM's dtype)
    kv_space_bytes: int | None = None  # a KV space the engine is given in bytes (vLLM's CPU build)
    mem_fraction: float | None = None  # the share of device memory a pool engine takes (SGLang, vLLM)
    vision: bool = False               # the vision tower is loaded (vLLM: unless served text-only)
    spec_method: str | None = None     # the drafting method (vLLM loads a checkpoint's MTP layers for "mtp")
    ubatch: int = 512                  # llama.cpp family: -ub (the compute graph is reserved for it)
    batch: int = 2048                  # llama.cpp family: -b (caps -ub)
    flash_attn: bool = True            # llama.cpp family: -fa (auto resolves to on for CPU and CUDA)


@runtime_checkable
class SettlesLaunch(Protocol):           # default: the options' ctx / parallel / kv_unified / kv_dtype
    def launch_settings(self, options: LaunchOptions, trained_ctx: int | None = None) -> Settled: ...


@runtime_checkable
class NormalisesMetrics(Protocol):       # default: no /metrics (Engine.metrics returns None)
    def normalise_metrics(self, text: str) -> Mapping[str, float]: ...


@dataclass(frozen=True)
class Knob:
    """A launch setting ``engineroom tune`` may change, and the values it tries beside the pick's.

    ``field``: a launch argument engineroom itself names (``kv_dtype``, ``parallel``, ``threads``), each
    value that field's; or ``engine_args``: each value the engine's own arguments (``("-ub", "1024")``)."""

    name: str                           # what the user reads: "KV type", "micro-batch (-ub)"
    field: str                          # kv_dtype | parallel | threads | engine_args
    values: tuple[Any, ...]
    why: str                            # what it changes, one phrase


@runtime_checkable
class TunesKnobs(Protocol):               # default: () (tune has nothing to search for this engine)
    def tune_knobs(self, objective: str, *, kv_dtype: str | None, parallel: int, cpu_cores: int | None,
                   kv_dtypes: Sequence[str]) -> tuple[Knob, ...]: ...


@runtime_checkable
class CountsBusySlots(Protocol):         # default: None (the engine shows no per-slot state)
    def busy_slots(self, payload: Any) -> int | None: ...


@runtime_checkable
class CountsTokens(Protocol):            # default: None (bench estimates and says so)
    def count_tokens(self, url: str, text: str, api_key: str | None = None, timeout: float = 30.0) -> int | None: ...


@runtime_checkable
class NormalisesTimings(Protocol):       # default: None (the block is kept raw only)
    def normalise_timings(self, raw: dict[str, Any]) -> EngineTimings | None: ...


@runtime_checkable
class ListsInstalls(Protocol):           # default: []
    def installed(self) -> list[dict[str, Any]]: ...


@runtime_checkable
class Installs(Protocol):                # default: NotFound ("install it yourself")
    def install(self, *, version: str | None = None, source: Path | None = None, jobs: int | None = None,
                cuda: bool | None = None, progress: Callable[[float | None, str], None] | None = None
                ) -> dict[str, Any]: ...


@runtime_checkable
class InstallsPrebuilt(Protocol):   # default: BadInput; the server alone, on kernels its package ships compiled
    def install_prebuilt(self, *, version: str | None = None, jobs: int | None = None,
                         progress: Callable[[float | None, str], None] | None = None) -> dict[str, Any]: ...


@runtime_checkable
class HasPlaceholderBinary(Protocol[BinaryT_co]):   # default: NotFound; may take ``vendor=`` too
    def placeholder_binary(self) -> BinaryT_co: ...


@runtime_checkable
class RendersContainerCommand(Protocol):   # default: argv[1:]
    def container_command(self, spec: LaunchSpec) -> Sequence[str]: ...


@runtime_checkable
class RendersContainerEnv(Protocol):     # default: spec.env
    def container_env(self, spec: LaunchSpec) -> Mapping[str, str]: ...


@runtime_checkable
class TellsBinaryVersion(Protocol[BinaryT_contra]):   # default: ""
    def binary_version(self, binary: BinaryT_contra) -> str: ...


@runtime_checkable
class ValidatesArgv(Protocol[BinaryT_contra]):  # default: None (nothing to ask)
    def validate_argv(self, binary: BinaryT_contra, argv: Sequence[str]) -> str | None: ...


@runtime_checkable
class RendersCluster(Protocol[BinaryT_contra]):   # default: NotFound (no multi-node recipe)
    def render_cluster(self, binary: BinaryT_contra, options: LaunchOptions, *, nodes: int, gpus_per_node: int,
                       head_addr: str) -> list[LaunchSpec]: ...


@runtime_checkable
class ConvertsModel(Protocol):           # default: the path itself
    def serving_model(self, path: Path, progress: Callable[[float | None, str], None] | None = None, *,
                      weights_format: str = "") -> Path: ...


@runtime_checkable
class MakesRandomWeights(Protocol):     # default: None (serves random weights only from a file that has them)
    def random_weights_loading(self, quant_format: str) -> str | None: ...


@runtime_checkable
class ShipsCatalog(Protocol):            # default: None (no catalog YAML of its own)
    def catalog_dir(self) -> Path | None: ...


@dataclass(frozen=True)
class Capabilities:
    tools: bool | None = None              # template/parser can emit tool calls
    tool_choice_required: bool | None = None
    parallel_tool_calls: bool | None = None
    json_schema: bool | None = None        # response_format json_schema
    reasoning: bool | None = None
    vision: bool | None = None
    timings: bool | None = None            # per-response engine timings
    # what a request must carry to generate exactly max_tokens (the adapter says: its own field);
    # empty: the engine declares no way. reasons["full_length"] says where it is from.
    full_length_body: dict[str, object] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)  # capability -> where we learnt it


@dataclass(frozen=True)
class ServerInfo:
    url: str
    engine: str                 # "llama.cpp", "vllm", ... or "unknown"
    engine_version: str = ""
    model_id: str = ""          # first id of /v1/models
    n_ctx: int | None = None
    total_slots: int | None = None
    capabilities: Capabilities = field(default_factory=Capabilities)
    chat_template: str | None = None
    extra: dict[str, object] = field(default_factory=dict)
    # the adapter's normalise_timings: the engine's timings block -> EngineTimings (None: no adapter)
    normalise_timings: TimingsNormaliser | None = field(default=None, compare=False, repr=False)


# --------------------------------------------------------------------------- engine timings
class DecodeWindow(StrEnum):
    """How an engine's decode window relates to the tokens it counts in it.

    The statistics turn ``decode_tokens`` / ``decode_ms`` into the engine's rate with this,
    so no engine's definition is written outside its adapter. The client's counterpart is
    always its inter-token rate, (tokens - 1) / (last token - first token): either engine
    definition is a per-token rate over the same decode steps.
    """

    FIRST_TOKEN_FREE = "first_token_free"   # the first token comes with the prompt: decode_tokens - 1 steps
    EVERY_TOKEN = "every_token"             # every counted token is a decode step in the window


@dataclass(frozen=True)
class EngineTimings:
    """One request's timings as the engine reported them, in engine-neutral fields.

    An adapter's ``normalise_timings(raw)`` fills this from the engine's own block, so the
    bench statistics and the card never read an engine's field names. ``None`` = the engine
    did not say. ``source`` names the engine fields behind the figures, for the card's
    provenance line (data, so the card prints it without knowing the engine).
    """

    decode_tokens: int | None = None        # tokens the engine generated
    decode_ms: float | None = None          # its decode window
    decode_window: DecodeWindow = DecodeWindow.EVERY_TOKEN
    prompt_tokens: int | None = None        # prompt tokens it evaluated (cache hits not counted)
    prompt_ms: float | None = None
    cached_tokens: int | None = None        # prompt tokens reused from its cache
    draft_tokens: int | None = None         # speculative decoding: drafted / accepted
    draft_accepted: int | None = None
    source: str = ""

    @property
    def decode_steps(self) -> int | None:
        if self.decode_tokens is None:
            return None
        return self.decode_tokens - 1 if self.decode_window is DecodeWindow.FIRST_TOKEN_FREE else self.decode_tokens

    @property
    def decode_tps(self) -> float | None:
        """The engine's own decode rate by its own definition, or None when it gave no window."""
        steps = self.decode_steps
        if steps is None or steps < 1 or not self.decode_ms or self.decode_ms <= 0:
            return None
        return steps / (self.decode_ms / 1000.0)

    @property
    def prompt_tps(self) -> float | None:
        if not self.prompt_tokens or not self.prompt_ms or self.prompt_ms <= 0:
            return None
        return self.prompt_tokens / (self.prompt_ms / 1000.0)

    def as_dict(self) -> dict[str, object]:
        return {f.name: (str(getattr(self, f.name)) if f.name == "decode_window" else getattr(self, f.name))
                for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EngineTimings:
        """From a stored record; unknown keys are ignored, an unknown window keeps the default."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        try:
            values["decode_window"] = DecodeWindow(values.get("decode_window", DecodeWindow.EVERY_TOKEN))
        except ValueError:
            values.pop("decode_window")
        return cls(**values)


# What an adapter's ``normalise_timings`` is: the engine's raw block (as sent) -> neutral fields.
TimingsNormaliser = Callable[[dict[str, Any]], "EngineTimings | None"]
