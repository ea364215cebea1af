"""A rendered LaunchSpec as a docker-compose document, checked against the Compose specification.

``render`` takes what an adapter rendered for the launch (``flows.prepare`` with
``container=True``: the adapter's stand-in program, the engine listening on every interface of
its container) and the engine's catalog ``docker:`` entry (its official image, pinned by tag)
and writes one service:

- the image's ``entrypoint`` stands in for the program; ``command`` is the adapter's
  ``container_command`` (the arguments after the program), host paths swapped for container
  paths: the model under the ``model-cache`` volume (``/models``), bind-mounted read-only from
  the host; other files the command names (a chat template, ...) read-only under
  ``/mnt/engineroom``; the API-key file as a compose secret (``/run/secrets/api_key_file``);
- the port published on 127.0.0.1 unless another address is asked for;
- a GPU reservation (``deploy.resources.reservations.devices``, driver nvidia, one per ``tp``);
- a healthcheck on the engine's health path, with the tool the image has;
- ``ipc`` / ``shm_size`` where the catalog says the engine's processes share memory;
- an environment without secrets: a value that looks like one is left for the shell that runs
  ``docker compose`` to supply (``VAR: null``), ``HF_TOKEN`` likewise.

Nothing here knows an engine: what differs per engine is the catalog entry and the adapter's
hook. ``validate`` checks a document against ``data/compose_spec.json`` (the Compose
specification's JSON schema, from docker-compose 1.29.2's wheel; origin and sha256 in
``data/README.md``), so a document that leaves engineroom is one Compose accepts; the commands
that run it (``docker compose`` or the older ``docker-compose``) are built here and run by
``flows``.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from .engines import Engine
from .engines.base import LaunchSpec
from .errors import BadInput, EngineFailed, NotFound
from .redaction import redact_argv, redact_data

SPEC_FILE = Path(__file__).parent / "data" / "compose_spec.json"
SPEC_SHA256 = "0dc04bd346dcfee1b1419628fff79937bbf076925f298f272a2b490e2b112bac"
SPEC_ORIGIN = "compose/config/compose_spec.json of the docker-compose 1.29.2 wheel (PyPI)"

CONTAINER_HOST = "0.0.0.0"            # the engine listens on its container's interfaces; `ports` binds the host side
DEFAULT_BIND = "127.0.0.1"            # the published port, on the host
MODELS_DIR = "/models"                # the model-cache volume; the host's model is mounted inside it
MODEL_CACHE_VOLUME = "model-cache"
MODEL_CACHE_NAME = "engineroom-model-cache"   # one volume shared by every project (downloads are kept)
FILES_DIR = "/mnt/engineroom"         # other host files the command names, read-only
SECRET_NAME = "api_key_file"          # -> /run/secrets/api_key_file in the container
SECRETS_DIR = "/run/secrets"
PASS_THROUGH = ("HF_TOKEN",)          # read from the shell running docker compose, never written down
HEALTH_INTERVAL_S = 10
HEALTH_TIMEOUT_S = 5
HEALTH_RETRIES = 3

INSTALL_DOCKER = ("install Docker Engine with `curl -fsSL https://get.docker.com | sh` (it brings `docker compose`; "
                  "Debian/Ubuntu: `sudo apt-get install docker.io docker-compose`) and, for the GPU, the NVIDIA "
                  "Container Toolkit")


@dataclass(frozen=True)
class Mount:
    """A host path the container reads, and where it appears there."""

    host: str
    container: str
    kind: str            # "model" | "file" | "secret"


@dataclass(frozen=True)
class ComposeRecipe:
    """One compose document for one engine launch, with what it was made from."""

    document: dict[str, Any]
    project: str                  # the compose project name (`-p`)
    service: str
    image: str                    # image:tag
    image_source: str             # where the catalog has the image and tag from
    url: str                      # where the published port answers, seen from the host
    health_path: str
    mounts: tuple[Mount, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)


# --------------------------------------------------------------------------- the image
def image_for(engine: str) -> Any:
    """The engine's catalog ``docker:`` entry with an image (NotFound, in the catalog's own words, without)."""
    from .catalog import load_catalog

    entry = load_catalog().engine(engine)
    docker = entry.docker if entry is not None else None
    if docker is None:
        raise NotFound(f"the catalog names no container image for {engine}, so engineroom cannot write a compose "
                       "file for it; run it with `engineroom up` instead.")
    if docker.reference is None:
        raise NotFound(docker.source.rstrip(".") + ".")
    return pinned(docker, engine)


RELEASE_FIELD = "{release}"


def pinned(docker: Any, engine: str) -> Any:
    """The catalog's image entry with its tag's ``{release}`` filled in by the adapter's ``RELEASE``
    (the version engineroom installs and whose parser checks the flags): one fact, two uses."""
    from .engines import adapter, has_adapter

    if docker.tag is None or RELEASE_FIELD not in docker.tag:
        return docker
    release = adapter(engine).release if has_adapter(engine) else ""
    if not release:
        raise NotFound(f"the catalog's image tag for {engine} ({docker.tag}) names the adapter's release, and the "
                       f"{engine} adapter names none; engineroom cannot pin its image.")
    return docker.model_copy(update={"tag": docker.tag.replace(RELEASE_FIELD, release)})


# --------------------------------------------------------------------------- names and values
def slug(text: str, limit: int = 40) -> str:
    """Lower-case letters, digits and dashes: a compose project or service name."""
    out = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:limit].strip("-")
    return out or "model"


def check_bind(host: str) -> str:
    """``host`` as the address a published port binds to: an IP address (Docker takes no names)."""
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        raise BadInput(f"the port is published on an IP address of this machine (127.0.0.1, 0.0.0.0, ...), "
                       f"not {host!r}.") from None


def _port_binding(bind: str, port: int) -> str:
    host = f"[{bind}]" if ":" in bind else bind
    return f"{host}:{port}:{port}"


def _escape(value: str) -> str:
    """A literal for a compose file: ``$`` is compose's interpolation, ``$$`` a dollar sign."""
    return value.replace("$", "$$")


def _mount_root(path: Path) -> Path:
    """What to bind-mount for ``path``: a file or folder in the Hugging Face cache is a set of
    links into the repo folder's blobs/, so the whole repo folder (models--ORG--NAME) goes in."""
    for parent in path.parents:
        if parent.name == "snapshots" and parent.parent.name.startswith("models--"):
            return parent.parent
    return path


# --------------------------------------------------------------------------- render
def render(spec: LaunchSpec, engine: Engine, *, bind: str = DEFAULT_BIND, tp: int = 1,
           key_file: str | None = None, key_source: str | Path | None = None, start_period_s: float = 300.0,
           project: str | None = None, image: Any = None) -> ComposeRecipe:
    """The compose document for ``spec`` (rendered for a container: see the module's notes).

    ``key_file`` is the key file's path as the command names it, ``key_source`` the host file
    the secret reads (default: the same); ``start_period_s`` is how long the healthcheck lets
    the engine load (``--timeout``). ``image``: the catalog's entry (default: ``image_for``).
    """
    docker = image if image is not None else image_for(spec.engine)
    bind = check_bind(bind)
    if tp < 1:
        raise BadInput(f"--tp must be at least 1; got {tp}.")
    service = slug(spec.engine)
    project = project or f"engineroom-{slug(spec.model or Path(spec.model_path).name)}"
    notes: list[str] = []
    mounts: dict[str, Mount] = {}
    volumes: list[dict[str, Any]] = [{"type": "volume", "source": MODEL_CACHE_VOLUME, "target": MODELS_DIR}]
    bound: dict[str, str] = {}           # host mount root -> its container path

    def mount_bind(host_arg: str, kind: str) -> None:
        host = Path(host_arg).expanduser()
        host = host if host.is_absolute() else host.resolve()
        root = _mount_root(host)
        if str(root) not in bound:
            base = MODELS_DIR if kind == "model" else f"{FILES_DIR}/{len(bound)}"
            bound[str(root)] = f"{base}/{root.name}"
            volumes.append({"type": "bind", "source": str(root), "target": bound[str(root)], "read_only": True})
        inside = bound[str(root)] + ("" if root == host else "/" + host.relative_to(root).as_posix())
        mounts[host_arg] = Mount(str(host), inside, kind)

    model = spec.model_path
    if model and (Path(model).is_absolute() or Path(model).exists()):
        mount_bind(model, "model")
        if not Path(model).exists():
            notes.append(f"the model is not on this machine yet ({model}): pull it before `docker compose up`")
    elif model:
        notes.append(f"the model {model} is not a local path: the engine fetches it into the {MODEL_CACHE_VOLUME} "
                     "volume")
    secrets: dict[str, Any] = {}
    if key_file:
        source = Path(key_source or key_file).expanduser()
        secrets[SECRET_NAME] = {"file": str(source if source.is_absolute() else source.resolve())}
        mounts[str(key_file)] = Mount(str(source), f"{SECRETS_DIR}/{SECRET_NAME}", "secret")
    args = engine.container_command(spec)
    for arg in args:                       # other host files the command names (chat template, ...)
        value = arg.partition("=")[2] if arg.startswith("-") and "=" in arg else arg
        if value not in mounts and value.startswith("/") and Path(value).exists():
            mount_bind(value, "file")
    # the adapter rendered the launch's own address (loopback), which no published port reaches inside a
    # container: the engine listens on the container's interfaces instead (the host side is `ports`)
    swaps = {host_arg: m.container for host_arg, m in mounts.items()}
    if _loopback(spec.host):
        swaps[spec.host] = CONTAINER_HOST
    command = [_escape(_container_arg(a, swaps)) for a in args]
    if redact_argv(command) != command:
        raise BadInput("the engine arguments hold a secret (a key or token after `--`), which a compose file "
                       "never stores; give the API key with --api-key-file and a token through the environment.")

    environment: dict[str, str | None] = {"HF_HOME": f"{MODELS_DIR}/huggingface"}
    for key, value in engine.container_env(spec).items():
        clean = redact_data({key: value}) == {key: value}
        environment[key] = _escape(_container_arg(value, swaps)) if clean else None
        if not clean:
            notes.append(f"{key} looks like a secret: compose takes it from the shell that runs it")
    for key in PASS_THROUGH:
        environment.setdefault(key, None)

    url = f"http://127.0.0.1:{spec.port}{spec.health_path}"
    if docker.health_probe == "curl":
        test = ["CMD", "curl", "-fsS", "-o", "/dev/null", url]
    else:
        test = ["CMD", "python3", "-c",
                f"import urllib.request; urllib.request.urlopen({url!r}, timeout={HEALTH_TIMEOUT_S - 1})"]
    svc: dict[str, Any] = {
        "image": docker.reference,
        "entrypoint": [_escape(a) for a in docker.entrypoint],
        "command": command,
        "ports": [_port_binding(bind, spec.port)],
        "volumes": volumes,
        "environment": environment,
        "healthcheck": {"test": test, "interval": f"{HEALTH_INTERVAL_S}s", "timeout": f"{HEALTH_TIMEOUT_S}s",
                        "retries": HEALTH_RETRIES, "start_period": f"{max(1, round(start_period_s))}s"},
        "deploy": {"resources": {"reservations": {"devices": [
            {"driver": "nvidia", "count": tp, "capabilities": ["gpu"]}]}}},
        "labels": {"engineroom.engine": spec.engine, "engineroom.model": spec.model or model},
    }
    if docker.ipc:
        svc["ipc"] = docker.ipc
    if docker.shm_size:
        svc["shm_size"] = docker.shm_size
    if secrets:
        svc["secrets"] = [{"source": SECRET_NAME, "target": SECRET_NAME}]
    doc: dict[str, Any] = {
        "services": {service: svc},
        "volumes": {MODEL_CACHE_VOLUME: {"name": MODEL_CACHE_NAME}},
    }
    if secrets:
        doc["secrets"] = secrets
    doc["x-engineroom"] = {"engine": spec.engine, "image_source": docker.source,
                           "changes": [dict(c) for c in spec.changes]}
    host_url = f"http://{'127.0.0.1' if bind in ('0.0.0.0', '::') else _url_host(bind)}:{spec.port}"
    return ComposeRecipe(document=doc, project=project, service=service, image=str(docker.reference),
                         image_source=docker.source, url=host_url, health_path=spec.health_path,
                         mounts=tuple(mounts.values()), notes=tuple(notes))


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def _url_host(bind: str) -> str:
    return f"[{bind}]" if ":" in bind else bind


def _container_arg(arg: str, swaps: Mapping[str, str]) -> str:
    """``arg`` with a host value the container sees otherwise swapped (``VALUE`` or ``--flag=VALUE``)."""
    if arg in swaps:
        return swaps[arg]
    name, eq, value = arg.partition("=")
    if eq and value in swaps:
        return f"{name}={swaps[value]}"
    return arg


# --------------------------------------------------------------------------- validation
@lru_cache(maxsize=1)
def spec_schema() -> dict[str, Any]:
    try:
        schema: dict[str, Any] = json.loads(SPEC_FILE.read_text())
    except (OSError, ValueError) as exc:
        raise NotFound(f"the Compose schema {SPEC_FILE} is missing or unreadable ({exc}); "
                       "reinstall engineroom.") from None
    return schema


_DURATION = re.compile(r"\A(\d+(\.\d+)?(ns|us|ms|s|m|h))+\Z")
_PORTS = re.compile(r"\A((\[[0-9a-fA-F:.]+\]|[0-9.]+):)?(\d+(-\d+)?:)?\d+(-\d+)?(/(tcp|udp|sctp))?\Z")


def _format_checker() -> Any:
    """The schema's own formats (``duration``, ``ports``), which jsonschema does not know."""
    import jsonschema

    checker = jsonschema.FormatChecker()
    checker.checks("duration")(lambda v: not isinstance(v, str) or bool(_DURATION.match(v)))
    checker.checks("ports")(lambda v: not isinstance(v, str) or bool(_PORTS.match(v)))
    return checker


def problems(doc: Any) -> list[str]:
    """Every way ``doc`` breaks the Compose specification, as ``where: what`` (empty: valid)."""
    import jsonschema

    validator = jsonschema.Draft201909Validator(spec_schema(), format_checker=_format_checker())
    out = []
    for err in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path))):
        deepest = jsonschema.exceptions.best_match([err, *err.context]) if err.context else err
        where = ".".join(str(p) for p in deepest.absolute_path) or "(top level)"
        out.append(f"{where}: {deepest.message}")
    return out


def validate(doc: Any) -> None:
    """BadInput, in one sentence, when ``doc`` is not a valid compose document."""
    found = problems(doc)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise BadInput(f"the compose document breaks the Compose specification at {found[0]}{more}.")


# --------------------------------------------------------------------------- text
def to_yaml(recipe: ComposeRecipe, header: Sequence[str] = ()) -> str:
    """The document as docker-compose.yml text, with comment lines first (how to run and stop it)."""
    lines = [f"# {h}" for h in header]
    lines += [f"# run:  docker compose -p {recipe.project} -f docker-compose.yml up -d",
              f"# stop: docker compose -p {recipe.project} -f docker-compose.yml down",
              f"# image {recipe.image} (pinned; where from: x-engineroom.image_source below)"]
    lines += [f"# note: {n}" for n in recipe.notes]
    body = yaml.safe_dump(recipe.document, sort_keys=False, default_flow_style=False, width=1000)
    return "\n".join(lines) + "\n" + body


# --------------------------------------------------------------------------- the Docker CLI
Runner = Callable[..., "subprocess.CompletedProcess[str]"]


def _ok(argv: Sequence[str], run: Runner, timeout: float = 20) -> subprocess.CompletedProcess[str] | None:
    try:
        proc = run(list(argv), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc if proc.returncode == 0 else None


def docker_cli(which: Callable[[str], str | None] = shutil.which, run: Runner = subprocess.run) -> list[str] | None:
    """How compose is run here: ``docker compose`` (the plugin), else ``docker-compose``; None: neither."""
    docker = which("docker")
    if docker and _ok([docker, "compose", "version"], run):
        return [docker, "compose"]
    legacy = which("docker-compose")
    return [legacy] if legacy else None


def not_installed(compose_file: Path | str | None = None) -> NotFound:
    where = f"; the compose file is written at {compose_file}" if compose_file else ""
    return NotFound(f"Docker is not installed here (neither `docker compose` nor `docker-compose` is on PATH): "
                    f"{INSTALL_DOCKER}{where}.")


def daemon_problem(which: Callable[[str], str | None] = shutil.which, run: Runner = subprocess.run) -> str | None:
    """Why the Docker daemon does not answer (its client's last line), or None when it does or
    there is no ``docker`` client to ask (``docker-compose`` alone then finds out itself)."""
    docker = which("docker")
    if not docker:
        return None
    try:
        proc = run([docker, "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`docker info` did not answer ({type(exc).__name__})"
    if proc.returncode == 0:
        return None
    lines = [ln.strip() for ln in (proc.stderr or proc.stdout or "").splitlines() if ln.strip()]
    return lines[-1] if lines else f"`docker info` exited with {proc.returncode}"


def compose_argv(cli: Sequence[str], compose_file: Path | str, project: str, *action: str) -> list[str]:
    """``<cli> -f FILE -p PROJECT <action...>`` (the same for the plugin and docker-compose)."""
    return [*cli, "-f", str(compose_file), "-p", project, *action]


def up_argv(cli: Sequence[str], compose_file: Path | str, project: str) -> list[str]:
    return compose_argv(cli, compose_file, project, "up", "-d")


def down_argv(cli: Sequence[str], compose_file: Path | str, project: str) -> list[str]:
    return compose_argv(cli, compose_file, project, "down")


def logs_argv(cli: Sequence[str], compose_file: Path | str, project: str, lines: int = 20) -> list[str]:
    return compose_argv(cli, compose_file, project, "logs", "--tail", str(lines))


def config_check(cli: Sequence[str], compose_file: Path | str, run: Runner = subprocess.run) -> str | None:
    """What ``<cli> config -q`` says is wrong with the file (no daemon needed), or None: valid."""
    argv = [*cli, "-f", str(compose_file), "config", "-q"]
    try:
        proc = run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EngineFailed(f"`{' '.join(argv)}` did not finish ({type(exc).__name__}).") from None
    if proc.returncode == 0:
        return None
    text = " ".join(ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip())
    return text or f"exit status {proc.returncode}"


def cli_version(cli: Sequence[str], run: Runner = subprocess.run) -> str:
    """``docker compose version`` / ``docker-compose version``: its first line."""
    proc = _ok([*cli, "version"], run)
    return proc.stdout.strip().splitlines()[0] if proc and proc.stdout.strip() else " ".join(cli)
