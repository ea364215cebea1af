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
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import httpx

from .. import net, plugins
from ..errors import EngineFailed, NotFound
from ..plugins import GROUP, Problem
from .base import Capabilities, EngineAdapter, LaunchChange, LaunchOptions, LaunchSpec, MemoryReport, ServerInfo

DEFAULT_ENGINE = "llama.cpp"   # the embedded default: runs on a fresh machine with no GPU


class Engine:
    """One adapter behind a typed face: required members pass through, optional hooks default."""

    def __init__(self, impl: Any, origin: str = "") -> None:
        self.impl = impl
        self.name: str = impl.ENGINE
        self.origin = origin          # "entry point llama.cpp = engineroom.engines.llamacpp (engineroom 0.1.0)"

    def __repr__(self) -> str:
        return f"Engine({self.name!r})"

    def _hook(self, name: str) -> Callable[..., Any] | None:
        fn = getattr(self.impl, name, None)
        return fn if callable(fn) else None

    # ---- required ---------------------------------------------------------------------
    def find_binary(self, explicit: str | os.PathLike[str] | None = None) -> Any:
        return self.impl.find_binary(explicit)

    def render(self, binary: Any, options: LaunchOptions) -> LaunchSpec:
        return self.impl.render(binary, options)

    def health_state(self, status_code: int | None) -> str:
        return self.impl.health_state(status_code)

    def classify_failure(self, log_text: str) -> str:
        return self.impl.classify_failure(log_text)

    def probe(self, url: str, timeout: float = 5.0, api_key: str | None = None) -> ServerInfo | None:
        if api_key:   # only then: an adapter that predates keys still probes servers without one
            return self.impl.probe(url, timeout=timeout, api_key=api_key)
        return self.impl.probe(url, timeout=timeout)

    # ---- optional ---------------------------------------------------------------------
    def cpu_adjustments(self, probe: Any, extra_args: Sequence[str] = ()) -> list[LaunchChange]:
        fn = self._hook("cpu_adjustments")
        return list(fn(probe, extra_args)) if fn else []

    def crash_fallback(self, argv: Sequence[str], returncode: int) -> LaunchChange | None:
        fn = self._hook("crash_fallback")
        return fn(argv, returncode) if fn else None

    def relaunch_spec(self, spec: LaunchSpec, change: LaunchChange) -> LaunchSpec:
        fn = self._hook("relaunch_spec")
        if fn:
            return fn(spec, change)
        return replace(spec, argv=tuple(spec.argv) + tuple(change.args),
                       changes=tuple(spec.changes) + (change.as_dict(),))

    def check_binary_cpu(self, binary: Any, probe: Any) -> dict[str, object]:
        fn = self._hook("check_binary_cpu")
        return fn(binary, probe) if fn else {}

    def rope_scaling_arg(self, args: Sequence[str]) -> str | None:
        fn = self._hook("rope_scaling_arg")
        return fn(args) if fn else None

    def rope_scaling_example(self, factor: int) -> str:
        fn = self._hook("rope_scaling_example")
        return fn(factor) if fn else f"the engine's RoPE-scaling arguments (factor {factor})"

    def repack_disabled(self, args: Sequence[str]) -> bool:
        fn = self._hook("repack_disabled")
        return bool(fn(args)) if fn else False

    def split_api_key(self, args: Sequence[str]) -> tuple[list[str], str | None, str | None]:
        """``args`` without the engine's API-key arguments, the key and the key file they gave."""
        fn = self._hook("split_api_key")
        return fn(args) if fn else (list(args), None, None)

    def api_key_file_in(self, argv: Sequence[str]) -> str | None:
        """The key file a running server of this engine was launched with (None: no key)."""
        fn = self._hook("api_key_file_in")
        return fn(argv) if fn else None

    def loads_refusal(self, path: Path) -> str | None:
        """Why the engine cannot serve the model at ``path`` (one sentence), or None."""
        fn = self._hook("loads_refusal")
        return fn(path) if fn else None

    def wait_hint(self, log_text: str) -> str | None:
        """What the engine is doing while it starts (its last meaningful log line), or None."""
        fn = self._hook("wait_hint")
        return fn(log_text) if fn else None

    @property
    def start_timeout(self) -> float:
        """Seconds to wait for the server to become healthy when the user gives no --timeout."""
        return float(getattr(self.impl, "START_TIMEOUT_S", 300.0))

    def memory_report(self, log_text: str) -> MemoryReport | None:
        """What the engine says it allocated, read from its log; None when it says nothing."""
        fn = self._hook("memory_report")
        return fn(log_text) if fn else None

    def launch_settings(self, options: LaunchOptions, trained_ctx: int | None = None) -> dict[str, Any]:
        """The settings the engine will run with for ``options`` (its defaults filled in, e.g. the
        context it picks from the model's ``trained_ctx`` when none is given), in fit's words:
        what the memory prediction must be made for."""
        fn = self._hook("launch_settings")
        if fn:
            return dict(fn(options, trained_ctx=trained_ctx))
        return {"ctx": options.ctx, "n_seqs": options.n_seqs or 1, "kv_unified": bool(options.kv_unified),
                "kv_dtype": options.kv_dtype}

    def metrics(self, url: str, api_key: str | None = None, timeout: float = 5.0) -> dict[str, float] | None:
        """The server's /metrics as engineroom's neutral counter names (the adapter's
        ``normalise_metrics``); None when the engine exposes none or the server does not answer."""
        fn = self._hook("normalise_metrics")
        if fn is None:
            return None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        try:
            resp = net.get(f"{url.rstrip('/')}/metrics", timeout=timeout, headers=headers)
        except httpx.HTTPError:
            return None
        if resp.status_code != 200:
            return None
        return dict(fn(resp.text)) or None

    def count_tokens(self, url: str, text: str, api_key: str | None = None, timeout: float = 30.0) -> int | None:
        """How many tokens the running server's own tokenizer makes of ``text`` (no special
        tokens added): the adapter's ``count_tokens``; None when the engine has no tokenizer
        endpoint or the server does not answer (bench then sizes prompts by an estimate and says so)."""
        fn = self._hook("count_tokens")
        if fn is None:
            return None
        try:
            found = fn(url, text, api_key=api_key, timeout=timeout)
        except httpx.HTTPError:
            return None
        return int(found) if isinstance(found, int) and not isinstance(found, bool) else None

    def normalise_timings(self, raw: Any) -> Any:
        fn = self._hook("normalise_timings")
        return fn(raw) if fn else None

    def installed(self) -> list[dict]:
        fn = self._hook("installed")
        return list(fn()) if fn else []

    def install(self, **kwargs: Any) -> Any:
        fn = self._hook("install")
        if fn is None:
            raise NotFound(f"engineroom cannot install {self.name}; install it yourself and pass --engine-bin.")
        return fn(**kwargs)

    @property
    def tested(self) -> str:
        """How engineroom's own tests and recorded runs exercise this engine (the adapter's
        ``TESTED``: "real: ...", "parser-validated: ...", "documented only: ..."), or ""."""
        return str(getattr(self.impl, "TESTED", "") or "")

    @property
    def can_install(self) -> bool:
        return self._hook("install") is not None

    def placeholder_binary(self, vendor: str | None = None) -> Any:
        """A stand-in for the engine's program where it is not installed, so a recipe can still
        be rendered (NotFound when the adapter cannot render without the real one). ``vendor``:
        the accelerator of the machine the recipe is for ("cpu", "nvidia", ...), for an adapter
        whose builds differ by device (its ``placeholder_binary(vendor=...)``); None = this machine."""
        fn = self._hook("placeholder_binary")
        if fn is None:
            raise NotFound(f"{self.name} is not installed here and its adapter cannot render without it.")
        if vendor is not None and "vendor" in inspect.signature(fn).parameters:
            return fn(vendor=vendor)
        return fn()

    def container_command(self, spec: LaunchSpec) -> list[str]:
        """The arguments that follow the container image's entrypoint (the catalog's ``docker.entrypoint``,
        which stands in for the program): by default the argv without its program, ``argv[1:]``."""
        fn = self._hook("container_command")
        return [str(a) for a in fn(spec)] if fn else [str(a) for a in spec.argv[1:]]

    def container_env(self, spec: LaunchSpec) -> dict[str, str]:
        """The environment the engine needs inside its official image: by default ``spec.env``; an
        adapter whose environment is about this machine's install (library paths, a CPU build's
        settings, offline switches) returns what holds in the image instead."""
        fn = self._hook("container_env")
        return {str(k): str(v) for k, v in (fn(spec) if fn else spec.env).items()}

    def binary_version(self, binary: Any) -> str:
        fn = self._hook("binary_version")
        return fn(binary) if fn else ""

    def validate_argv(self, binary: Any, argv: Sequence[str]) -> str | None:
        """Why the engine's own argument parser rejects ``argv`` (one sentence), or None when it
        accepts it or the adapter has no parser to ask."""
        fn = self._hook("validate_argv")
        return fn(binary, argv) if fn else None

    @property
    def can_validate(self) -> bool:
        return self._hook("validate_argv") is not None

    def render_cluster(self, binary: Any, options: LaunchOptions, **cluster: Any) -> list[LaunchSpec]:
        """One LaunchSpec per node for a multi-node launch (``nodes``, ``gpus_per_node``,
        ``head_addr``, ``pp``, ...: the adapter's ``render_cluster`` documents them)."""
        fn = self._hook("render_cluster")
        if fn is None:
            raise NotFound(f"{self.name} has no multi-node recipe in engineroom (vLLM and SGLang have one).")
        return list(fn(binary, options, **cluster))

    def serving_model(self, path: Path, progress: Callable[[float | None, str], None] | None = None) -> Path:
        """The model path the engine loads for ``path`` (an adapter may convert a file it cannot
        read, e.g. a GGUF into a safetensors folder); by default ``path`` itself."""
        fn = self._hook("serving_model")
        return Path(fn(path, progress)) if fn else path

    def catalog_dir(self) -> Path | None:
        """A folder of catalog YAML the adapter's package ships (engines/, models/, ...), or None."""
        fn = self._hook("catalog_dir")
        if fn:
            found = fn()
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


def all_engines() -> tuple[Engine, ...]:
    return tuple(_registry()[0].values())


def problems() -> tuple[Problem, ...]:
    return _registry()[1]


def names() -> tuple[str, ...]:
    return tuple(_registry()[0])


def adapter(engine: str) -> Engine:
    try:
        return _registry()[0][engine]
    except KeyError:
        raise NotFound(f"no adapter for engine {engine!r}; engineroom can launch: {', '.join(names())}.") from None


def has_adapter(engine: str) -> bool:
    return engine in _registry()[0]


def timings_normaliser(engine: str) -> Callable[[Any], Any] | None:
    """The adapter's ``normalise_timings`` for ``engine`` (None: unknown engine or none declared)."""
    if not has_adapter(engine):
        return None
    fn = adapter(engine)._hook("normalise_timings")
    return fn


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


__all__ = ["DEFAULT_ENGINE", "GROUP", "Capabilities", "Engine", "EngineAdapter", "LaunchChange", "LaunchOptions",
           "LaunchSpec", "MemoryReport", "ServerInfo", "adapter", "all_engines", "detect", "has_adapter", "names",
           "problems", "reload", "timings_normaliser"]
