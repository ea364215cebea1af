"""Engine adapters, found through the ``engineroom.engines`` entry-point group.

An adapter is any object satisfying ``base.EngineAdapter`` (engineroom's own are modules),
registered by its package the way ``llm`` takes plugins::

    [project.entry-points."engineroom.engines"]
    "my-engine" = "my_package.adapter"          # a module or a module:attribute

engineroom registers its built-in adapters the same way (its own pyproject.toml), so a
third-party engine is a package away and nothing outside an adapter (and its catalog YAML,
``catalog_dir()``) branches on an engine's name. Callers get an ``Engine``: the adapter behind
one typed face that supplies a neutral default for every optional hook.

``detect(url)`` asks each adapter whether a running server is its own, so verify and bench
work on any OpenAI-compatible endpoint and learn the engine from the server itself.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from .. import net, plugins
from ..errors import BadInput, EngineFailed, NotFound
from ..plugins import GROUP, Problem
from . import argvcheck, base
from .argvcheck import ArgvCheck
from .base import (
    Capabilities,
    EngineAdapter,
    EngineBinary,
    EngineTimings,
    HealthState,
    LaunchChange,
    LaunchOptions,
    LaunchSpec,
    MemoryReport,
    ServerInfo,
    TimingsNormaliser,
)

if TYPE_CHECKING:
    from ..cpuprobe import CpuProbe
    from ..placement import Placement

T = TypeVar("T")

DEFAULT_ENGINE = "llama.cpp"   # the embedded default: runs on a fresh machine with no GPU


class Engine:
    """One adapter behind a typed face: required members pass through, optional hooks default.

    Each optional hook is reached through an ``isinstance`` check against its Protocol in
    ``base`` (``ReportsMemory``, ``NormalisesTimings``, ...), so mypy checks every call and a
    plugin that lacks the hook gets the default written beside the Protocol.
    """

    def __init__(self, impl: EngineAdapter[Any], origin: str = "") -> None:
        self.impl = impl
        self.name: str = impl.ENGINE
        self.origin = origin          # "entry point llama.cpp = engineroom.engines.llamacpp (engineroom 0.1.0)"

    def __repr__(self) -> str:
        return f"Engine({self.name!r})"

    def _data(self, name: str, kind: type[T], default: T) -> T:
        value = getattr(self.impl, name, None)
        return value if isinstance(value, kind) else default

    # ---- required ---------------------------------------------------------------------
    def find_binary(self, explicit: str | os.PathLike[str] | None = None) -> EngineBinary:
        return self.impl.find_binary(explicit)

    def render(self, binary: EngineBinary, options: LaunchOptions) -> LaunchSpec:
        return self.impl.render(binary, options)

    def health_state(self, status_code: int | None) -> HealthState:
        """The adapter's state as a HealthState (a plugin answering plain strings is read by value)."""
        state = self.impl.health_state(status_code)
        try:
            return HealthState(state)
        except ValueError:      # a word the enum lacks is not "ready": waited on like a load
            return HealthState.LOADING

    def classify_failure(self, log_text: str) -> str:
        return self.impl.classify_failure(log_text)

    def probe(self, url: str, timeout: float = 5.0, api_key: str | None = None) -> ServerInfo | None:
        if api_key:   # only then: an adapter that predates keys still probes servers without one
            return self.impl.probe(url, timeout=timeout, api_key=api_key)
        return self.impl.probe(url, timeout=timeout)

    # ---- optional ---------------------------------------------------------------------
    def cpu_adjustments(self, probe: CpuProbe, extra_args: Sequence[str] = ()) -> list[LaunchChange]:
        impl = self.impl
        return list(impl.cpu_adjustments(probe, extra_args)) if isinstance(impl, base.AdjustsForCpu) else []

    def host_cache_change(self, spare_bytes: int, extra_args: Sequence[str] = ()) -> LaunchChange | None:
        """The argument that keeps the engine's host-RAM cache within ``spare_bytes`` (what the
        launch leaves of the host's usable memory), or None (no such cache, or it fits)."""
        impl = self.impl
        return impl.host_cache_change(spare_bytes, extra_args) if isinstance(impl, base.CapsHostCache) else None

    def crash_fallback(self, argv: Sequence[str], returncode: int) -> LaunchChange | None:
        impl = self.impl
        return impl.crash_fallback(argv, returncode) if isinstance(impl, base.FallsBackAfterCrash) else None

    def relaunch_spec(self, spec: LaunchSpec, change: LaunchChange) -> LaunchSpec:
        impl = self.impl
        if isinstance(impl, base.RelaunchesSpec):
            return impl.relaunch_spec(spec, change)
        return replace(spec, argv=tuple(spec.argv) + tuple(change.args),
                       changes=tuple(spec.changes) + (change.as_dict(),))

    def check_binary_cpu(self, binary: EngineBinary, probe: CpuProbe) -> dict[str, object]:
        impl = self.impl
        return impl.check_binary_cpu(binary, probe) if isinstance(impl, base.ChecksBinaryCpu) else {}

    def rope_scaling_arg(self, args: Sequence[str]) -> str | None:
        impl = self.impl
        return impl.rope_scaling_arg(args) if isinstance(impl, base.FindsRopeScaling) else None

    def rope_scaling_example(self, factor: int) -> str:
        impl = self.impl
        if isinstance(impl, base.ShowsRopeScaling):
            return impl.rope_scaling_example(factor)
        return f"the engine's RoPE-scaling arguments (factor {factor})"

    def repack_disabled(self, args: Sequence[str]) -> bool:
        impl = self.impl
        return bool(impl.repack_disabled(args)) if isinstance(impl, base.Repacks) else False

    def split_api_key(self, args: Sequence[str]) -> tuple[list[str], str | None, str | None]:
        """``args`` without the engine's API-key arguments, the key and the key file they gave."""
        impl = self.impl
        return impl.split_api_key(args) if isinstance(impl, base.SplitsApiKey) else (list(args), None, None)

    def api_key_file_in(self, argv: Sequence[str]) -> str | None:
        """The key file a running server of this engine was launched with (None: no key)."""
        impl = self.impl
        return impl.api_key_file_in(argv) if isinstance(impl, base.FindsApiKeyFile) else None

    def loads_refusal(self, path: Path) -> str | None:
        """Why the engine cannot serve the model at ``path`` (one sentence), or None."""
        impl = self.impl
        return impl.loads_refusal(path) if isinstance(impl, base.RefusesModels) else None

    def wait_hint(self, log_text: str) -> str | None:
        """What the engine is doing while it starts (its last meaningful log line), or None."""
        impl = self.impl
        return impl.wait_hint(log_text) if isinstance(impl, base.HintsWhileWaiting) else None

    @property
    def start_timeout(self) -> float:
        """Seconds to wait for the server to become healthy when the user gives no --timeout."""
        value = getattr(self.impl, "START_TIMEOUT_S", None)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 300.0

    def memory_report(self, log_text: str) -> MemoryReport | None:
        """What the engine says it allocated, read from its log; None when it says nothing."""
        impl = self.impl
        return impl.memory_report(log_text) if isinstance(impl, base.ReportsMemory) else None

    def placement_report(self, log_text: str) -> Placement | None:
        """Where the engine put the model (layers, weights and KV per side, context, slots), read
        from its log; None when it says nothing (the placement check then says unknown)."""
        impl = self.impl
        return impl.placement_report(log_text) if isinstance(impl, base.ReportsPlacement) else None

    def tune_knobs(self, objective: str, *, kv_dtype: str | None, parallel: int, cpu_cores: int | None,
                   kv_dtypes: Sequence[str]) -> tuple[base.Knob, ...]:
        """The settings ``engineroom tune`` tries for ``objective`` (``decode_tps`` or ``aggregate_tps``),
        beside the pick's ``kv_dtype`` and ``parallel``; ``cpu_cores`` on a CPU launch, else None."""
        impl = self.impl
        if not isinstance(impl, base.TunesKnobs):
            return ()
        return tuple(impl.tune_knobs(objective, kv_dtype=kv_dtype, parallel=parallel, cpu_cores=cpu_cores,
                                     kv_dtypes=kv_dtypes))

    def launch_settings(self, options: LaunchOptions, trained_ctx: int | None = None) -> base.Settled:
        """The settings the engine will run with for ``options`` (its defaults filled in, e.g. the
        context it picks from the model's ``trained_ctx`` when none is given), in fit's words:
        what the memory prediction must be made for."""
        impl = self.impl
        if isinstance(impl, base.SettlesLaunch):
            return impl.launch_settings(options, trained_ctx=trained_ctx)
        return base.Settled(ctx=options.ctx, parallel=options.parallel or 1, kv_unified=bool(options.kv_unified),
                            kv_dtype=options.kv_dtype)

    def metrics(self, url: str, api_key: str | None = None, timeout: float = 5.0) -> dict[str, float] | None:
        """The server's /metrics as engineroom's neutral counter names (the adapter's
        ``normalise_metrics``); None when the engine exposes none or the server does not answer."""
        impl = self.impl
        if not isinstance(impl, base.NormalisesMetrics):
            return None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        try:
            resp = net.get(f"{url.rstrip('/')}/metrics", timeout=timeout, headers=headers)
        except httpx.HTTPError:
            return None
        if resp.status_code != 200:
            return None
        return dict(impl.normalise_metrics(resp.text)) or None

    def busy_slots(self, url: str, api_key: str | None = None, timeout: float = 2.0) -> int | None:
        """How many of the server's slots are processing a request right now (the adapter reads the
        engine's own slot listing: ``SLOTS_PATH`` and ``busy_slots``); None when the engine shows none,
        hides it, or does not answer."""
        impl = self.impl
        path = self._data("SLOTS_PATH", str, "")
        if not path or not isinstance(impl, base.CountsBusySlots):
            return None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        try:
            resp = net.get(f"{url.rstrip('/')}{path}", timeout=timeout, headers=headers)
            return impl.busy_slots(resp.json()) if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    def count_tokens(self, url: str, text: str, api_key: str | None = None, timeout: float = 30.0) -> int | None:
        """How many tokens the running server's own tokenizer makes of ``text`` (no special
        tokens added): the adapter's ``count_tokens``; None when the engine has no tokenizer
        endpoint or the server does not answer (bench then sizes prompts by an estimate and says so)."""
        impl = self.impl
        if not isinstance(impl, base.CountsTokens):
            return None
        try:
            found = impl.count_tokens(url, text, api_key=api_key, timeout=timeout)
        except httpx.HTTPError:
            return None
        return found if isinstance(found, int) and not isinstance(found, bool) else None

    def normalise_timings(self, raw: dict[str, Any]) -> EngineTimings | None:
        """The engine's timings block (as the client kept it, ``timings_block``) in neutral fields."""
        impl = self.impl
        return impl.normalise_timings(raw) if isinstance(impl, base.NormalisesTimings) else None

    @property
    def timings_field(self) -> str | None:
        """The top-level response field holding the engine's per-response timings (its
        ``TIMINGS_FIELD``), or None when it sends none."""
        return self._data("TIMINGS_FIELD", str, "") or None

    def installed(self) -> list[dict[str, Any]]:
        impl = self.impl
        return list(impl.installed()) if isinstance(impl, base.ListsInstalls) else []

    def install(self, *, version: str | None = None, source: Path | None = None, jobs: int | None = None,
                cuda: bool | None = None, prebuilt: bool = False,
                progress: Callable[[float | None, str], None] | None = None) -> dict[str, Any]:
        """Build or install the engine; ``prebuilt``: the server alone, against the compute kernels the engine's
        package ships compiled (an adapter with ``install_prebuilt``; BadInput for any other, or with
        ``source`` or ``cuda``)."""
        impl = self.impl
        if not isinstance(impl, base.Installs):
            raise NotFound(f"engineroom cannot install {self.name}; install it yourself and pass --engine-bin.")
        if not prebuilt:
            return impl.install(version=version, source=source, jobs=jobs, cuda=cuda, progress=progress)
        if not isinstance(impl, base.InstallsPrebuilt):
            raise BadInput(f"{self.name} has no prebuilt kernels to build against; drop --prebuilt.")
        if source is not None:
            raise BadInput("--prebuilt builds the package's own release; drop --source or --prebuilt.")
        if cuda:
            raise BadInput("--prebuilt takes CPU kernels and builds no CUDA; drop --cuda or --prebuilt.")
        return impl.install_prebuilt(version=version, jobs=jobs, progress=progress)

    @property
    def tested(self) -> str:
        """How engineroom's own tests and recorded runs exercise this engine (the adapter's
        ``TESTED``: "real: ...", "parser-validated: ...", "documented only: ..."), or ""."""
        return self._data("TESTED", str, "")

    @property
    def can_install(self) -> bool:
        return isinstance(self.impl, base.Installs)

    def placeholder_binary(self, vendor: str | None = None) -> EngineBinary:
        """A stand-in for the engine's program where it is not installed, so a recipe can still
        be rendered (NotFound when the adapter cannot render without the real one). ``vendor``:
        the accelerator of the machine the recipe is for ("cpu", "nvidia", ...), for an adapter
        whose builds differ by device (its ``placeholder_binary(vendor=...)``); None = this machine."""
        impl = self.impl
        if not isinstance(impl, base.HasPlaceholderBinary):
            raise NotFound(f"{self.name} is not installed here and its adapter cannot render without it.")
        if vendor is not None and "vendor" in inspect.signature(impl.placeholder_binary).parameters:
            by_vendor: Callable[..., EngineBinary] = impl.placeholder_binary
            return by_vendor(vendor=vendor)
        return impl.placeholder_binary()

    def container_command(self, spec: LaunchSpec) -> list[str]:
        """The arguments that follow the container image's entrypoint (the catalog's ``docker.entrypoint``,
        which stands in for the program): by default the argv without its program, ``argv[1:]``."""
        impl = self.impl
        args = impl.container_command(spec) if isinstance(impl, base.RendersContainerCommand) else spec.argv[1:]
        return [str(a) for a in args]

    def container_env(self, spec: LaunchSpec) -> dict[str, str]:
        """The environment the engine needs inside its official image: by default ``spec.env``; an
        adapter whose environment is about this machine's install (library paths, a CPU build's
        settings, offline switches) returns what holds in the image instead."""
        impl = self.impl
        env = impl.container_env(spec) if isinstance(impl, base.RendersContainerEnv) else spec.env
        return {str(k): str(v) for k, v in env.items()}

    def binary_version(self, binary: EngineBinary) -> str:
        impl = self.impl
        return impl.binary_version(binary) if isinstance(impl, base.TellsBinaryVersion) else ""

    def validate_argv(self, binary: EngineBinary, argv: Sequence[str]) -> str | None:
        """Why the engine's own argument parser rejects ``argv`` (one sentence), or None when it
        accepts it or the adapter has no parser to ask."""
        impl = self.impl
        return impl.validate_argv(binary, argv) if isinstance(impl, base.ValidatesArgv) else None

    @property
    def can_validate(self) -> bool:
        return isinstance(self.impl, base.ValidatesArgv)

    def check_argv(self, argvs: Sequence[Sequence[str]],
                   engine_bin: str | os.PathLike[str] | None = None) -> ArgvCheck:
        """``argvs`` (rendered for here, another rig or an image) put to the parser of the engine
        installed on this machine: accepted, rejected (the parser's sentence) or not validated
        and why (``argvcheck``)."""
        return argvcheck.check(self, argvs, engine_bin)

    @property
    def release(self) -> str:
        """The engine release engineroom installs and checks its flags against (the adapter's
        ``RELEASE``): what a catalog image tag's ``{release}`` stands for; "" when it names none."""
        return self._data("RELEASE", str, "")

    @property
    def max_parallel(self) -> int:
        """The most sequences (slots) one server of the engine takes (the adapter's ``MAX_SEQS``);
        0 when the adapter states no limit."""
        return self._data("MAX_SEQS", int, 0)

    def render_cluster(self, binary: EngineBinary, options: LaunchOptions, **cluster: Any) -> list[LaunchSpec]:
        """One LaunchSpec per node for a multi-node launch (``nodes``, ``gpus_per_node``,
        ``head_addr``, ``pp``, ...: the adapter's ``render_cluster`` documents them)."""
        impl = self.impl
        if not isinstance(impl, base.RendersCluster):
            raise NotFound(f"{self.name} has no multi-node recipe in engineroom (vLLM and SGLang have one).")
        return list(impl.render_cluster(binary, options, **cluster))

    def serving_model(self, path: Path, progress: Callable[[float | None, str], None] | None = None, *,
                      weights_format: str = "") -> Path:
        """The model path the engine loads for ``path`` (an adapter may convert a file it cannot
        read, e.g. a GGUF into a safetensors folder; ``weights_format``: the pick's quantization method, for
        an engine that makes a random-weight file's weights itself); by default ``path`` itself."""
        impl = self.impl
        if not isinstance(impl, base.ConvertsModel):
            return path
        return Path(impl.serving_model(path, progress, weights_format=weights_format))

    def random_weights_loading(self, quant_format: str) -> str | None:
        """How the engine serves random weights of a model's shape in ``quant_format`` without a file of them
        (a sentence), or None: it needs a file that has them (a random-weight GGUF). ``try`` of a pick in
        another format writes the shape and tokenizer alone for an engine that can."""
        impl = self.impl
        if not isinstance(impl, base.MakesRandomWeights):
            return None
        found = impl.random_weights_loading(quant_format)
        return None if found is None else str(found)

    def catalog_dir(self) -> Path | None:
        """A folder of catalog YAML the adapter's package ships (engines/, models/, ...), or None."""
        impl = self.impl
        if isinstance(impl, base.ShipsCatalog):
            found = impl.catalog_dir()
            return Path(found) if found else None
        return None


@lru_cache(maxsize=1)
def _registry() -> tuple[dict[str, Engine], tuple[Problem, ...]]:
    found, problems = plugins.adapters()
    return {f.impl.ENGINE: Engine(f.impl, f.origin) for f in found}, problems


def reload() -> None:
    """Forget the adapters found so far (tests add an entry point and look again)."""
    plugins.reload()
    _registry.cache_clear()
    _timings_fields.cache_clear()


def all_engines() -> tuple[Engine, ...]:
    return tuple(_registry()[0].values())


def problems() -> tuple[Problem, ...]:
    return _registry()[1]


def names() -> tuple[str, ...]:
    return tuple(_registry()[0])


def resolve(engine: str) -> str:
    """The engine id for an id or any of its catalog names and aliases (``llamacpp``, ``llama-cpp``
    -> ``llama.cpp``): the one resolver every command uses, so fit, plan, recipe and up agree. A
    name no adapter or catalog entry knows comes back as given."""
    if engine in _registry()[0]:
        return engine
    from ..catalog import load_catalog

    entry = load_catalog().engine(engine)
    return entry.id if entry is not None else engine


def adapter(engine: str) -> Engine:
    try:
        return _registry()[0][resolve(engine)]
    except KeyError:
        raise NotFound(f"no adapter for engine {engine!r}; engineroom can launch: {', '.join(names())}.") from None


def has_adapter(engine: str) -> bool:
    return resolve(engine) in _registry()[0]


def timings_normaliser(engine: str) -> TimingsNormaliser | None:
    """The adapter's ``normalise_timings`` for ``engine`` (None: unknown engine or none declared)."""
    if not has_adapter(engine):
        return None
    impl = adapter(engine).impl
    return impl.normalise_timings if isinstance(impl, base.NormalisesTimings) else None


@lru_cache(maxsize=1)
def _timings_fields() -> tuple[str, ...]:
    return tuple(dict.fromkeys(f for e in all_engines() if (f := e.timings_field)))


def timings_block(engine_fields: Mapping[str, Any]) -> dict[str, Any] | None:
    """The per-response timings block among an answer's engine-specific fields (the client's
    ``engine_fields``): the field an adapter names as its ``TIMINGS_FIELD``, when it holds a
    mapping. The client asks this so it never names an engine's field itself."""
    for name in _timings_fields():
        block = engine_fields.get(name)
        if isinstance(block, Mapping) and block:
            return dict(block)
    return None


def detect(url: str, timeout: float = 5.0, api_key: str | None = None) -> ServerInfo:
    """Identify the server at ``url``; a reachable OpenAI server of unknown make is 'unknown'."""
    url = url.rstrip("/")
    for a in all_engines():
        info = a.probe(url, timeout=timeout, api_key=api_key)
        if info is not None:
            return info
    try:
        resp = net.get(f"{url}/v1/models", timeout=timeout,
                       headers={"Authorization": f"Bearer {api_key}"} if api_key else None)
    except httpx.HTTPError as exc:
        raise NotFound(f"no server answers at {url} ({type(exc).__name__}).") from None
    try:
        body = resp.json()
        data = body["data"]
        model_id = data[0]["id"] if data else ""
    except (ValueError, KeyError, TypeError, IndexError):
        raise EngineFailed(
            f"{url} answered /v1/models with HTTP {resp.status_code} but not an OpenAI model list; "
            "is this an OpenAI-compatible server?"
        ) from None
    return ServerInfo(url=url, engine="unknown", model_id=model_id)


__all__ = ["DEFAULT_ENGINE", "GROUP", "ArgvCheck",
           "Capabilities", "Engine", "EngineAdapter", "EngineBinary", "HealthState",
           "LaunchChange", "LaunchOptions", "LaunchSpec", "MemoryReport", "ServerInfo", "adapter", "all_engines",
           "detect", "has_adapter", "names", "problems", "reload", "timings_block", "timings_normaliser"]
