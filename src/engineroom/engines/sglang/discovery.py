"""Finding and installing SGLang: its own Python environment (``engines/pyenv``), the version it says.

SGLang is a Python package (``python -m sglang.launch_server``), so the "binary" is the
interpreter of an environment that holds it. ``engineroom engines install sglang`` makes one
with ``pyenv.create``; ``$ENGINEROOM_SGLANG_PYTHON`` or ``--engine-bin`` names another.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import NotFound
from ..installs import given_program

ENGINE = "sglang"
VERSION = "0.5.23"                      # the release `engines install sglang` pins
RELEASE = VERSION                       # its parser checks the flags; the compose image is this release's
PACKAGE = "sglang"
MODULE = "sglang.launch_server"         # what `python -m` runs
ENV_BINARY = "ENGINEROOM_SGLANG_PYTHON"
# measured here (2 cores, pip, PyPI mirror): 336 s for 208 packages, 11 GB on disk (torch + CUDA wheels)
EXPECTED_BUILD = "about 6 minutes with pip and 11 GB of disk: 208 packages, torch with its CUDA wheels"
# A CPU build of torch is published only on PyTorch's own index; engineroom tries it when it
# answers and otherwise takes the torch PyPI resolves (the CUDA build: it imports without a GPU).
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"


@dataclass(frozen=True)
class Binary:
    """The interpreter of an environment holding SGLang (what ``render`` puts first on the command line)."""

    python: Path
    origin: str                  # "--engine-bin" | "$ENGINEROOM_SGLANG_PYTHON" | "engineroom engines install (TAG)"
    env: dict[str, str] = field(default_factory=dict)
    version: str = ""                    # the sglang release, when the manifest says it

    @property
    def path(self) -> Path:              # engine-neutral callers print ``binary.path``
        return self.python


def installed() -> list[dict]:
    """Manifests of the environments `engineroom engines install sglang` made, newest first."""
    from .. import pyenv

    return pyenv.installed(ENGINE)


def _index_reachable(url: str, timeout: float = 5.0) -> bool:
    import httpx

    try:
        return httpx.head(url + "/", timeout=timeout, follow_redirects=True).status_code < 500
    except httpx.HTTPError:
        return False


def requirements(version: str) -> list[str]:
    return [f"{PACKAGE}=={version}"]


def install(*, version: str | None = None, source: Path | None = None, jobs: int | None = None,
            cuda: bool | None = None, progress: Callable[[float | None, str], None] | None = None) -> dict:
    """Make SGLang's environment (``pyenv.create``) and return its manifest.

    ``source``: a local sglang wheel or source tree installed in place of the PyPI release.
    A CPU torch comes from PyTorch's CPU index when that index answers (``cuda=True`` skips it);
    otherwise torch is whatever PyPI resolves for the pinned sglang. ``jobs`` is unused (nothing
    is compiled).
    """
    from .. import pyenv

    del jobs
    say = progress or (lambda _f, _m: None)
    version = version or VERSION
    reqs = requirements(version)
    if source is not None:
        src = Path(source).expanduser()
        if not src.exists():
            raise NotFound(f"--source {src} does not exist.")
        reqs = [str(src.resolve())]
    index_urls: list[str] = []
    if not cuda:
        if _index_reachable(CPU_TORCH_INDEX):
            index_urls = [CPU_TORCH_INDEX]
            say(None, f"a CPU torch from {CPU_TORCH_INDEX}")
        else:
            say(None, f"{CPU_TORCH_INDEX} does not answer here: torch comes from PyPI (its CUDA build)")
    manifest = pyenv.create(ENGINE, version, reqs, index_urls=index_urls, progress=progress)
    got = manifest.get("packages", {})
    say(None, f"sglang {got.get(PACKAGE, '?')} with torch {got.get('torch', '?')} "
              f"in {manifest.get('install_seconds')} s")
    return manifest


def find_binary(explicit: str | os.PathLike[str] | None = None) -> Binary:
    """Discovery order: ``--engine-bin`` (a Python with sglang), ``$ENGINEROOM_SGLANG_PYTHON``,
    the newest `engineroom engines install sglang` environment."""
    given = given_program(explicit, ENV_BINARY, "the Python")
    if given is not None:
        return Binary(given[0].absolute(), given[1])
    for manifest in installed():
        version = str(manifest.get("packages", {}).get(PACKAGE) or manifest.get("version", ""))
        return Binary(Path(manifest["python"]), f"engineroom engines install ({manifest.get('tag', version)})",
                      version=version)
    raise NotFound("SGLang not found: install it with `engineroom engines install sglang`, or pass "
                   "--engine-bin with a Python that has sglang installed.")


def placeholder_binary() -> Binary:
    """The interpreter's name alone, for a recipe printed where SGLang is not installed."""
    return Binary(python=Path("python"), origin="not installed here")


def binary_version(binary: Binary, timeout: float = 60) -> str:
    """The installed sglang release (package metadata, so nothing heavy is imported).

    Raises NotFound when the interpreter does not run or has no sglang.
    """
    if binary.version:
        return binary.version
    code = "import importlib.metadata as m; print(m.version('sglang'))"
    try:
        proc = subprocess.run([str(binary.python), "-c", code], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **binary.env})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NotFound(f"{binary.python} does not run ({exc}).") from None
    if proc.returncode != 0:
        raise NotFound(f"{binary.python} has no sglang installed; install it with `engineroom engines install sglang`.")
    return proc.stdout.strip()
