"""The launch as a container: `recipe --compose` writes a docker-compose.yml for the plan's (or the
user's) launch; `up --docker` runs it with Docker Compose and waits until the engine is healthy."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from .. import apikey, compose, engines, launch, paths
from ..errors import BadInput, EngineFailed, NotFound
from ..launchargs import DEFAULT_HOST, LaunchArgs
from .picks import Pick
from .prepared import Prepared
from .serving import prepare

COMPOSE_FILE = "docker-compose.yml"
KEY_FILE = "api_key"             # an up --docker key, beside its compose file (0600)


@dataclass(frozen=True)
class ComposeOutcome:
    """A compose recipe: the document, its text, where it was written, how it was checked."""

    recipe: compose.ComposeRecipe
    text: str
    path: Path | None                    # None: printed only
    prepared: Prepared
    checks: dict[str, str] = field(default_factory=dict)    # validator -> "valid" | "SKIP: why"


@dataclass(frozen=True)
class DockerServer:
    """A compose project `up --docker` started and found healthy."""

    project: str
    service: str
    image: str
    compose_file: str
    url: str
    engine: str
    model: str
    ready_s: float
    up: list[str]
    down: list[str]
    notes: list[str] = field(default_factory=list)


def _prepare_for_container(model: str, args: LaunchArgs, *, pick: Pick | None, download: bool,
                           api_key: str | None) -> Prepared:
    args = replace(args, host=DEFAULT_HOST, engine_bin=None)   # the image brings the engine; bind is the compose file's
    if args.port == 0:
        raise BadInput("a compose file publishes a fixed port: give --port N (not 0).")
    if getattr(pick, "cluster", None):
        raise BadInput("the plan's pick spans several machines; a compose file describes one: `engineroom recipe` "
                       "without --compose prints each node's command.")
    return prepare(model, args, download=download, require_binary=False, container=True, pick=pick, api_key=api_key)


def _render(prepared: Prepared, *, bind: str, key_source: Path | None, project: str | None = None,
            timeout: float = 300.0) -> compose.ComposeRecipe:
    spec = prepared.spec
    key_file = str(prepared.key.file) if prepared.key and prepared.key.file else None
    if key_file == apikey.RECIPE_PLACEHOLDER:
        raise BadInput("a compose file names its API key by file: give --api-key-file PATH (a file only you can "
                       "read); --api-key and --api-key-env are read by `engineroom up --docker` itself.")
    tp = int(prepared.args.tp or 1)
    recipe = compose.render(spec, engines.adapter(spec.engine), bind=bind, tp=tp, key_file=key_file,
                            key_source=key_source, start_period_s=timeout, project=project)
    compose.validate(recipe.document)
    return recipe


def _header(prepared: Prepared) -> list[str]:
    lines = [f"engineroom recipe --compose: {prepared.spec.engine} serving {prepared.spec.model}"]
    if prepared.pick is not None:
        lines.append(prepared.pick.source)
        lines += [f"note: {n}" for n in prepared.pick.notes]
    return lines


def cli_checks(text: str, which: Callable[[str], str | None] | None = None) -> dict[str, str]:
    """``text`` checked by the Docker CLI's own ``config`` where one is here (no daemon needed):
    {cli version: "valid" | its complaint}, or {"docker compose config": "SKIP: why"}."""
    cli = compose.docker_cli(which) if which else compose.docker_cli()
    if cli is None:
        return {"docker compose config": "SKIP: neither `docker compose` nor `docker-compose` is on PATH"}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / COMPOSE_FILE
        path.write_text(text)
        problem = compose.config_check(cli, path)
    return {compose.cli_version(cli): "valid" if problem is None else problem}


PARSER_CHECK = "the engine's own parser"


def parser_check(prepared: Prepared, engine_bin: str | None) -> dict[str, str]:
    """The container's command line put to the parser of the engine installed here: {PARSER_CHECK:
    "valid (ENGINE VERSION)" | "SKIP: why"}; BadInput when the parser rejects it (no file is
    written). The image is the adapter's release (``compose.image_for``); a parser of another
    version here is said, since its verdict is then not the image's."""
    adapter = engines.adapter(prepared.spec.engine)
    verdict = adapter.check_argv([list(prepared.spec.argv)], engine_bin)
    if not verdict.ok:
        raise BadInput(f"{verdict.line()}; engineroom writes no compose file for a command its engine refuses.")
    if verdict.status != "accepted":
        return {PARSER_CHECK: f"SKIP: {verdict.line()}"}
    release = adapter.release
    if release and release not in verdict.version:
        return {PARSER_CHECK: f"valid ({adapter.name} {verdict.version} here; the image runs {release}, whose "
                              "parser was not asked)"}
    return {PARSER_CHECK: f"valid ({adapter.name} {verdict.version}, the image's release)"}


def compose_recipe(model: str, args: LaunchArgs | None = None, *, out: Path | None = None,
                   bind: str = compose.DEFAULT_BIND, pick: Pick | None = None, check_cli: bool = True,
                   api_key: str | None = None) -> ComposeOutcome:
    """The docker-compose.yml for ``model`` launched with ``args`` (what `recipe` takes), validated
    against the Compose schema (and the Docker CLI's ``config`` where one is here); written to ``out``.
    ``args.engine_bin``, where given, is the installed engine whose parser checks the flags."""
    args = args or LaunchArgs()
    timeout = float(args.timeout or 300.0)
    prepared = _prepare_for_container(model, args, pick=pick, download=False, api_key=api_key)
    recipe = _render(prepared, bind=bind, key_source=None, timeout=timeout)
    parser = parser_check(prepared, args.engine_bin)
    text = compose.to_yaml(recipe, [*_header(prepared), *(f"{k}: {v}" for k, v in parser.items())])
    checks = {f"schema ({compose.SPEC_ORIGIN})": "valid", **parser}
    if check_cli:
        checks.update(cli_checks(text))
        bad = {k: v for k, v in checks.items() if not v.startswith(("valid", "SKIP"))}
        if bad:
            name, why = next(iter(bad.items()))
            raise EngineFailed(f"{name} rejects the compose file engineroom wrote ({why}); please report it.")
    if out is not None:
        out = Path(out).expanduser()
        if out.is_dir():
            out = out / COMPOSE_FILE
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)
        except OSError as exc:
            raise BadInput(f"cannot write {out} ({exc.strerror}).") from None
    return ComposeOutcome(recipe, text, out, prepared, checks)


# --------------------------------------------------------------------------- up --docker
def _private_copy(src: Path, dest: Path) -> Path:
    """``src``'s key in a new 0600 file ``dest`` (a container's secret outlives engineroom's own key files)."""
    dest.unlink(missing_ok=True)
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(apikey.read_key_file(src) + "\n")
    return dest


def _run(argv: list[str], what: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise EngineFailed(f"`{' '.join(argv)}` ({what}) did not finish in {timeout:.0f} s.") from None
    except OSError as exc:
        raise NotFound(f"cannot run {argv[0]} ({exc.strerror}).") from None


def _last_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [ln.strip() for ln in (proc.stderr + "\n" + proc.stdout).splitlines() if ln.strip()]
    return lines[-1] if lines else f"exit status {proc.returncode}"


def docker_up(model: str, args: LaunchArgs | None = None, *, bind: str = compose.DEFAULT_BIND,
              pick: Pick | None = None, say: Callable[[str], None] | None = None,
              on_wait: Callable[[str, float], None] | None = None, poll: float = 1.0,
              api_key: str | None = None) -> DockerServer:
    """Write the compose file for ``model`` and run it (``docker compose up -d``), then wait until
    the engine's health path says ready. Docker is looked for before anything is downloaded; a
    start that never becomes healthy is taken down again (``docker compose down``)."""
    cli = compose.docker_cli()
    if cli is None:
        raise compose.not_installed()
    problem = compose.daemon_problem()
    if problem:
        raise NotFound(f"Docker is installed but its daemon does not answer ({problem}); start it "
                       "(`sudo systemctl start docker`) and run this again.")
    args = args or LaunchArgs()
    timeout = float(args.timeout or 300.0)
    prepared = _prepare_for_container(model, args, pick=pick, download=True, api_key=api_key)
    spec = prepared.spec
    project = f"engineroom-{compose.slug(spec.model or Path(spec.model_path).name)}"
    folder = paths.state_dir() / "docker" / project
    folder.mkdir(parents=True, exist_ok=True)
    key = prepared.key
    key_source = key.file if key is not None else None      # the user's --api-key-file is mounted as it is
    try:
        if key is not None and key.written and key.file is not None:
            # a key engineroom wrote (--api-key, --api-key-env): the container's copy lives with its project,
            # since `engineroom down` and the next managed launch remove engineroom's own key files
            key_source = _private_copy(key.file, folder / KEY_FILE)
        recipe = _render(prepared, bind=bind, key_source=key_source, project=project, timeout=timeout)
    finally:
        if key is not None:
            apikey.discard(key)
    compose_file = folder / COMPOSE_FILE
    compose_file.write_text(compose.to_yaml(recipe, _header(prepared)))
    up = compose.up_argv(cli, compose_file, project)
    down = compose.down_argv(cli, compose_file, project)
    if launch.port_in_use("127.0.0.1", spec.port):
        raise BadInput(f"port {spec.port} is already in use; pick another with --port.")
    if say:
        say(f"docker compose up: {recipe.image}")
    started = time.time()
    proc = _run(up, "starting the container")
    if proc.returncode != 0:
        raise EngineFailed(f"`{' '.join(up)}` failed ({_last_line(proc)}).", detail=(proc.stderr or "")[-2000:])
    adapter = engines.adapter(spec.engine)
    try:
        while True:
            phase = adapter.health_state(launch.probe_health(recipe.url, recipe.health_path))
            elapsed = time.time() - started
            if phase == "ready":
                break
            if on_wait:
                on_wait(phase, elapsed)
            if elapsed > timeout:
                logs = _run(compose.logs_argv(cli, compose_file, project), "reading the logs", timeout=60)
                _run(down, "stopping the container", timeout=120)
                raise EngineFailed(f"{spec.engine} in its container was not healthy after {timeout:.0f} s (last "
                                   f"state: {phase}); stopped it. Raise --timeout for slow loads (image pulls "
                                   f"count too); compose file: {compose_file}", detail=logs.stdout[-4000:])
            time.sleep(poll)
    except KeyboardInterrupt:
        _run(down, "stopping the container", timeout=120)
        raise
    return DockerServer(project=project, service=recipe.service, image=recipe.image, compose_file=str(compose_file),
                        url=recipe.url, engine=spec.engine, model=spec.model, ready_s=round(time.time() - started, 1),
                        up=up, down=down, notes=list(recipe.notes))
