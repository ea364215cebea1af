"""recipe --compose and up --docker: compose documents for every engine with an image, validated
against the Compose specification's JSON schema (and docker compose's own `config` where a CLI is
here), and the Docker commands, including the real "Docker is not here" path."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from engineroom import compose, engines, flows
from engineroom.engines.base import LaunchSpec
from engineroom.errors import BadInput, NotFound
from engineroom.launchargs import LaunchArgs

from conftest import cli

REPO_MODEL = "Qwen/Qwen3-0.6B"      # a safetensors repo: what vLLM and SGLang serve (not downloaded here)


def _recipe(model: str = "smollm2-135m", *, bind: str | None = None, api_key: str | None = None,
            **fields) -> flows.ComposeOutcome:
    """`recipe --compose` of ``model`` with the launch arguments ``fields`` (LaunchArgs' names)."""
    more = {"bind": bind} if bind is not None else {}
    return flows.compose_recipe(model, LaunchArgs(**fields), check_cli=False, api_key=api_key, **more)


def _service(doc: dict) -> dict:
    (svc,) = doc["services"].values()
    return svc


# --------------------------------------------------------------------------- the schema file
def test_the_compose_schema_is_the_file_taken_from_docker_compose_1_29_2():
    data = compose.SPEC_FILE.read_bytes()
    assert hashlib.sha256(data).hexdigest() == compose.SPEC_SHA256
    schema = json.loads(data)
    assert schema["$schema"] == "http://json-schema.org/draft/2019-09/schema#"
    assert "services" in schema["properties"] and schema["additionalProperties"] is False


# --------------------------------------------------------------------------- llama.cpp
def test_llamacpp_compose_runs_the_adapters_command_in_the_pinned_image():
    done = _recipe(ctx=2048)
    doc, spec = done.recipe.document, done.prepared.spec
    svc = _service(doc)
    assert svc["image"] == "ghcr.io/ggml-org/llama.cpp:server-cuda-b11434"
    assert svc["entrypoint"] == ["/app/llama-server"]
    # the adapter's own arguments after its program, with the model at its container path and the
    # engine listening on the container's interfaces (the host side is `ports`)
    model_inside = f"{compose.MODELS_DIR}/{Path(spec.model_path).name}"
    expected = [model_inside if a == spec.model_path else compose.CONTAINER_HOST if a == spec.host else a
                for a in spec.argv[1:]]
    assert svc["command"] == expected
    assert spec.host == "127.0.0.1" and compose.CONTAINER_HOST in svc["command"]
    assert svc["ports"] == ["127.0.0.1:8080:8080"]
    model_cache, model_file = svc["volumes"]
    assert model_cache == {"type": "volume", "source": compose.MODEL_CACHE_VOLUME, "target": compose.MODELS_DIR}
    assert model_file == {"type": "bind", "source": spec.model_path, "target": model_inside, "read_only": True}
    assert doc["volumes"][compose.MODEL_CACHE_VOLUME] == {"name": compose.MODEL_CACHE_NAME}
    assert svc["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert svc["healthcheck"]["test"][:2] == ["CMD", "curl"]
    assert svc["healthcheck"]["test"][-1] == f"http://127.0.0.1:8080{spec.health_path}"
    assert "ipc" not in svc and "shm_size" not in svc        # llama.cpp shares no memory between processes
    assert svc["environment"]["HF_TOKEN"] is None            # taken from the shell, never written down
    assert compose.problems(doc) == []
    assert yaml.safe_load(done.text) == doc                  # the text is the document (comments aside)


def test_tp_reserves_that_many_gpus_and_a_port_is_published_where_asked():
    done = _recipe(tp=2, port=9001, bind="0.0.0.0")
    svc = _service(done.recipe.document)
    assert svc["deploy"]["resources"]["reservations"]["devices"][0]["count"] == 2
    assert svc["ports"] == ["0.0.0.0:9001:9001"]
    assert svc["healthcheck"]["test"][-1].startswith("http://127.0.0.1:9001/")
    assert _service(_recipe(bind="::1").recipe.document)["ports"] == ["[::1]:8080:8080"]
    compose.validate(done.recipe.document)


def test_a_host_that_is_not_an_address_and_port_zero_are_refused():
    with pytest.raises(BadInput, match="an IP address"):
        _recipe(bind="example.com")
    with pytest.raises(BadInput, match="fixed port"):
        _recipe(port=0)


def test_the_api_key_file_becomes_a_compose_secret_and_the_key_appears_nowhere(tmp_path):
    key = tmp_path / "key"
    key.write_text("sk-thisisthesecretkeyvalue0123456789\n")
    key.chmod(0o600)
    done = _recipe(api_key_file=str(key))
    svc = _service(done.recipe.document)
    assert done.recipe.document["secrets"] == {compose.SECRET_NAME: {"file": str(key)}}
    assert svc["secrets"] == [{"source": compose.SECRET_NAME, "target": compose.SECRET_NAME}]
    assert f"{compose.SECRETS_DIR}/{compose.SECRET_NAME}" in svc["command"]
    assert str(key) not in svc["command"]
    assert "thisisthesecretkeyvalue" not in done.text
    compose.validate(done.recipe.document)


def test_a_key_by_value_or_variable_is_refused_in_a_compose_recipe(monkeypatch):
    monkeypatch.setenv("MY_KEY", "sk-another0123456789abcdefghij")
    with pytest.raises(BadInput, match="--api-key-file"):
        _recipe(api_key_env="MY_KEY")
    with pytest.raises(BadInput, match="--api-key-file"):
        _recipe(api_key="sk-another0123456789abcdefghij")


def test_a_chat_template_is_mounted_read_only_and_dollars_are_escaped():
    # a real flag of llama-server: the recipe's command line is put to its own parser where it is installed
    done = _recipe(tools_template=True, extra_args=("--slot-save-path", "a$b"))
    svc = _service(done.recipe.document)
    template = next(v for v in svc["volumes"] if v["target"].startswith(compose.FILES_DIR))
    assert template["read_only"] is True and Path(template["source"]).is_file()
    assert template["target"] in svc["command"] and template["source"] not in svc["command"]
    assert "a$$b" in svc["command"]                          # compose's interpolation would eat a lone $
    compose.validate(done.recipe.document)


class _FakeAdapter:
    ENGINE = "llama.cpp"


def test_an_environment_value_that_looks_like_a_secret_is_left_to_the_shell():
    secret = "hf_" + "a" * 34
    spec = LaunchSpec(engine="llama.cpp", argv=("prog", "--listen", "127.0.0.1", "--model", "/nonexistent/m.gguf"),
                      port=8080, env={"MY_TOKEN": secret, "PLAIN": "1"}, model="m", model_path="/nonexistent/m.gguf")
    recipe = compose.render(spec, engines.Engine(_FakeAdapter()))
    env = _service(recipe.document)["environment"]
    assert env["MY_TOKEN"] is None and env["PLAIN"] == "1"
    text = compose.to_yaml(recipe)
    assert secret not in text
    assert _service(recipe.document)["command"] == ["--listen", "0.0.0.0", "--model", "/models/m.gguf"]
    assert any("not on this machine" in n for n in recipe.notes)
    compose.validate(recipe.document)


def test_a_hugging_face_cache_file_mounts_its_repo_folder_so_the_blob_links_resolve(tmp_path):
    repo = tmp_path / "hub" / "models--org--name"
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "blobs" / "sha").write_text("weights")
    (snap / "m.gguf").symlink_to("../../blobs/sha")
    path = str(snap / "m.gguf")
    spec = LaunchSpec(engine="llama.cpp", argv=("prog", "--model", path), port=8080, model="m", model_path=path)
    svc = _service(compose.render(spec, engines.Engine(_FakeAdapter())).document)
    assert svc["volumes"][1] == {"type": "bind", "source": str(repo), "target": "/models/models--org--name",
                                 "read_only": True}
    assert svc["command"] == ["--model", "/models/models--org--name/snapshots/abc123/m.gguf"]


# --------------------------------------------------------------------------- the other engines
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_vllm_and_sglang_compose_documents(engine):
    adapter = engines.adapter(engine)      # built in (pyproject's entry points): a missing one fails loudly
    done = _recipe(REPO_MODEL, engine=engine, tp=2)
    svc = _service(done.recipe.document)
    image = compose.image_for(engine)
    assert svc["image"] == f"{image.image}:{image.tag}" and image.tag != "latest"
    assert svc["entrypoint"] == list(image.entrypoint)
    assert svc["command"] == [compose.CONTAINER_HOST if a == done.prepared.spec.host else a
                              for a in adapter.container_command(done.prepared.spec)]
    assert svc["ipc"] == "host"                                 # PyTorch shares tensors through /dev/shm
    assert svc["deploy"]["resources"]["reservations"]["devices"][0]["count"] == 2
    assert svc["healthcheck"]["test"][:2] == ["CMD", "python3"]
    assert any("not a local path" in n for n in done.recipe.notes)   # the repo is fetched into the cache volume
    compose.validate(done.recipe.document)


def test_ik_llamacpp_has_no_official_image_and_says_so_in_one_sentence():
    with pytest.raises(NotFound) as err:
        compose.image_for("ik_llama.cpp")
    message = str(err.value)
    assert "no official container image" in message and message.count(". ") == 0 and message.endswith(".")


# --------------------------------------------------------------------------- validation, negative
def _valid_doc() -> dict:
    return _recipe().recipe.document


@pytest.mark.parametrize(("break_it", "where"), [
    (lambda d: _service(d).update(bogus_key=1), "services.llama-cpp"),
    (lambda d: d.update(not_a_section={}), "(top level)"),
    (lambda d: _service(d)["healthcheck"].update(interval="ten seconds"), "services.llama-cpp.healthcheck.interval"),
    (lambda d: _service(d).update(ports=["127.0.0.1:http:8080"]), "services.llama-cpp.ports"),
    (lambda d: _service(d)["deploy"]["resources"]["reservations"]["devices"][0].update(gpus=1),
     "services.llama-cpp.deploy.resources.reservations.devices.0"),
])
def test_a_document_that_breaks_the_spec_is_rejected(break_it, where):
    doc = _valid_doc()
    break_it(doc)
    found = compose.problems(doc)
    assert found and found[0].startswith(where)
    with pytest.raises(BadInput, match="breaks the Compose specification"):
        compose.validate(doc)


def _cli_or_skip() -> list[str]:
    cli = compose.docker_cli()
    if cli is None:
        pytest.skip("no Docker CLI here (neither `docker compose` nor `docker-compose` on PATH; "
                    "`apt-get install docker-compose` gives the latter)")
    return cli


def test_docker_compose_config_accepts_every_generated_file_and_rejects_a_bad_key(tmp_path):
    cli = _cli_or_skip()
    texts = {"llama.cpp": _recipe(ctx=2048, tp=2).text}
    for engine in ("vllm", "sglang"):
        texts[engine] = _recipe(REPO_MODEL, engine=engine).text
    for engine, text in texts.items():
        path = tmp_path / f"{engine}.yml"
        path.write_text(text)
        assert compose.config_check(cli, path) is None, engine
    bad = _valid_doc()
    _service(bad).update(bogus_key=1)
    path = tmp_path / "bad.yml"
    path.write_text(yaml.safe_dump(bad))
    problem = compose.config_check(cli, path)
    assert problem is not None and "bogus_key" in problem


def test_compose_recipe_checks_with_the_docker_cli_when_one_is_here():
    cli = compose.docker_cli()
    checks = flows.compose_recipe("smollm2-135m").checks
    assert checks[f"schema ({compose.SPEC_ORIGIN})"] == "valid"
    # the engine's own parser (llama-server --help) where llama.cpp is installed here, else a SKIP saying so
    assert checks.pop(flows.docker.PARSER_CHECK).startswith(("valid (llama.cpp ", "SKIP: not validated: llama.cpp"))
    if cli is None:
        assert checks == {f"schema ({compose.SPEC_ORIGIN})": "valid",
                          "docker compose config": "SKIP: neither `docker compose` nor `docker-compose` is on PATH"}
    else:
        assert checks[compose.cli_version(cli)] == "valid"


# --------------------------------------------------------------------------- the Docker commands
def _completed(rc: int, out: str = "", err: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess([], rc, out, err)


def test_docker_cli_prefers_the_compose_plugin_then_docker_compose():
    found = {"docker": "/usr/bin/docker", "docker-compose": "/usr/bin/docker-compose"}
    plugin = lambda argv, **kw: _completed(0, "Docker Compose version v2.40.0")  # noqa: E731
    no_plugin = lambda argv, **kw: _completed(1, "", "docker: unknown command: docker compose")  # noqa: E731
    assert compose.docker_cli(found.get, plugin) == ["/usr/bin/docker", "compose"]
    assert compose.docker_cli(found.get, no_plugin) == ["/usr/bin/docker-compose"]
    assert compose.docker_cli({"docker": "/usr/bin/docker"}.get, no_plugin) is None
    assert compose.docker_cli({}.get, plugin) is None


def test_the_commands_that_run_a_compose_project():
    cli = ["docker", "compose"]
    assert compose.up_argv(cli, "/s/docker-compose.yml", "engineroom-m") == [
        "docker", "compose", "-f", "/s/docker-compose.yml", "-p", "engineroom-m", "up", "-d"]
    assert compose.down_argv(["docker-compose"], "/s/f.yml", "p") == ["docker-compose", "-f", "/s/f.yml", "-p", "p",
                                                                      "down"]
    assert compose.logs_argv(cli, "f", "p", 5)[-3:] == ["logs", "--tail", "5"]
    seen = []
    assert compose.config_check(cli, "f.yml", lambda argv, **kw: seen.append(argv) or _completed(0)) is None
    assert seen == [["docker", "compose", "-f", "f.yml", "config", "-q"]]
    assert compose.config_check(cli, "f.yml", lambda argv, **kw: _completed(1, "", "bad\nthing")) == "bad thing"


def test_the_daemon_check_reports_the_clients_last_line():
    which = {"docker": "/usr/bin/docker"}.get
    down = lambda argv, **kw: _completed(1, "", "Cannot connect to the Docker daemon at unix:///var/run/docker.sock")  # noqa: E731
    assert "Cannot connect" in compose.daemon_problem(which, down)
    assert compose.daemon_problem(which, lambda argv, **kw: _completed(0, "28.2.2")) is None
    assert compose.daemon_problem({}.get, down) is None      # docker-compose alone: it finds out itself


def test_up_docker_runs_compose_up_then_waits_for_health(monkeypatch, tmp_path):
    """The flow with the Docker commands recorded instead of run (no daemon here): up -d, the health
    path polled until ready; a start that never gets healthy is taken down again."""
    from engineroom import launch
    from engineroom.errors import EngineFailed
    from engineroom.flows import docker as docker_flow

    ran: list[list[str]] = []
    monkeypatch.setattr(compose, "docker_cli", lambda: ["docker", "compose"])
    monkeypatch.setattr(compose, "daemon_problem", lambda: None)
    monkeypatch.setattr(docker_flow, "_run", lambda argv, what, timeout=600: ran.append(argv) or _completed(0))
    real_prepare = docker_flow._prepare_for_container
    monkeypatch.setattr(docker_flow, "_prepare_for_container",
                        lambda model, args, *, pick, download, api_key: real_prepare(
                            model, args, pick=pick, download=False, api_key=api_key))
    monkeypatch.setattr(launch, "port_in_use", lambda host, port: False)
    answers = iter([None, 503, 200])
    monkeypatch.setattr(launch, "probe_health", lambda url, path: next(answers))
    server = flows.docker_up("smollm2-135m", LaunchArgs(port=8123), poll=0)
    assert ran == [server.up]
    assert server.up[:2] == ["docker", "compose"] and server.up[-2:] == ["up", "-d"]
    assert server.down[-1] == "down" and server.url == "http://127.0.0.1:8123"
    written = yaml.safe_load(Path(server.compose_file).read_text())
    compose.validate(written)
    assert _service(written)["ports"] == ["127.0.0.1:8123:8123"]

    ran.clear()
    monkeypatch.setattr(launch, "probe_health", lambda url, path: 503)
    with pytest.raises(EngineFailed, match="not healthy after 0 s"):
        flows.docker_up("smollm2-135m", LaunchArgs(port=8123, timeout=0.0001), poll=0)
    assert [argv[-3] if argv[-2] == "--tail" else argv[-1] for argv in ran] == ["-d", "logs", "down"]


# --------------------------------------------------------------------------- the command line
def test_cli_recipe_compose_json_and_out(tmp_path):
    proc = cli("recipe", "smollm2-135m", "--compose", "--json", "--ctx", "1024", timeout=180)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["image"] == "ghcr.io/ggml-org/llama.cpp:server-cuda-b11434"
    assert out["validated"][f"schema ({compose.SPEC_ORIGIN})"] == "valid"
    assert yaml.safe_load(out["yaml"]) == out["compose"] and out["path"] is None
    compose.validate(out["compose"])

    proc = cli("recipe", "smollm2-135m", "--compose", "--out", str(tmp_path), timeout=180)
    assert proc.returncode == 0, proc.stderr
    written = tmp_path / "docker-compose.yml"
    compose.validate(yaml.safe_load(written.read_text()))
    assert f"wrote {written}" in proc.stdout

    proc = cli("recipe", "smollm2-135m", "--compose", timeout=180)      # plain: the YAML itself
    assert proc.returncode == 0 and yaml.safe_load(proc.stdout)["services"]


def test_cli_out_and_host_without_compose_or_docker_are_refused_in_one_sentence(tmp_path):
    for args in (["recipe", "smollm2-135m", "--out", str(tmp_path / "x.yml")], ["up", "smollm2-135m", "--host",
                                                                                   "0.0.0.0"]):
        proc = cli(*args, timeout=180)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr
        assert "go" in proc.stderr and proc.stderr.strip().count("\n") == 0, proc.stderr


def test_cli_recipe_compose_refuses_ik_llamacpp_in_one_sentence():
    proc = cli("recipe", "smollm2-135m", "--engine", "ik_llama.cpp", "--compose", timeout=180)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "no official container image" in proc.stderr


def test_cli_up_docker_without_docker_says_so_with_the_install_command(tmp_path):
    """The real path: no docker or docker-compose on PATH (an empty PATH), nothing downloaded."""
    empty = tmp_path / "bin"
    empty.mkdir()
    proc = cli("up", "smollm2-135m", "--docker", env={"PATH": str(empty)}, timeout=180)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "Docker is not installed here" in proc.stderr and "get.docker.com" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0, proc.stderr


def test_cli_up_docker_with_a_client_but_no_daemon_says_so():
    docker = shutil.which("docker")
    if docker is None or compose.docker_cli() is None:
        pytest.skip("no docker client with compose here: the no-daemon path needs one")
    if compose.daemon_problem() is None:
        pytest.skip("a Docker daemon answers here: the no-daemon path cannot be reached")
    proc = cli("up", "smollm2-135m", "--docker", timeout=180, env={"PATH": os.environ.get("PATH", "")})
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "daemon does not answer" in proc.stderr


def test_a_secret_among_the_engine_arguments_is_refused():
    with pytest.raises(BadInput, match="never stores"):
        _recipe(extra_args=("--hf-token", "hf_" + "b" * 34))
