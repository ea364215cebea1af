"""The SGLang adapter: its command line, refusals, API-key shim, multi-node recipe, /metrics, and
the rendered command lines checked by SGLang's OWN argument parser (``ServerArgs.add_cli_args``).

The parser tier needs SGLang installed: the ``sglang_binary`` fixture uses the caller's
`engineroom engines install sglang` environment (or ``$ENGINEROOM_SGLANG_PYTHON``) and otherwise
runs that command itself, into the caller's data folder so a later session reuses it. When it
cannot install or import SGLang, those tests SKIP with the reason. No SGLang server is started:
SGLang 0.5.23 serves on CUDA / ROCm (and other accelerators) only, and this machine has none
(see benchmarks/sglang_parser.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engineroom import engines
from engineroom.engines import sglang
from engineroom.engines.base import LaunchOptions
from engineroom.errors import BadInput, NotFound

FIXTURE_METRICS = Path(__file__).parent / "fixtures" / "sglang" / "metrics_sample_from_sglang_metric_names.txt"
PY = sglang.Binary(python=Path(sys.executable), origin="test", version="0.5.23")


def _model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "Qwen3-8B"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}))
    return d


def _opts(tmp_path: Path, **kw) -> LaunchOptions:
    return LaunchOptions(model_path=_model_dir(tmp_path), **{"model_name": "qwen3-8b", "port": 30001, **kw})


def _value(argv, flag: str) -> str:
    argv = list(argv)
    return argv[argv.index(flag) + 1]


# --------------------------------------------------------------------------- render
def test_render_passes_what_was_sized_explicitly(tmp_path):
    spec = sglang.render(PY, _opts(tmp_path, ctx=8192, parallel=6, tp=2, kv_dtype="fp8_e4m3", mem_fraction=0.8,
                                   tool_parser="qwen3_coder", reasoning_parser="qwen3", thinking=False,
                                   extra_args=("--chunked-prefill-size", "4096")))
    argv = spec.argv
    assert argv[:3] == (sys.executable, "-m", "sglang.launch_server")
    assert spec.engine == "sglang" and spec.host == "127.0.0.1" and spec.port == 30001
    assert _value(argv, "--host") == "127.0.0.1" and _value(argv, "--port") == "30001"
    assert _value(argv, "--served-model-name") == "qwen3-8b"
    assert _value(argv, "--context-length") == "8192"          # per request: SGLang's context is per sequence
    assert _value(argv, "--max-running-requests") == "6"
    assert _value(argv, "--tp-size") == "2"
    assert _value(argv, "--kv-cache-dtype") == "fp8_e4m3"
    assert _value(argv, "--mem-fraction-static") == "0.8"
    assert _value(argv, "--tool-call-parser") == "qwen3_coder"
    assert _value(argv, "--reasoning-parser") == "qwen3"
    assert json.loads(_value(argv, "--default-chat-template-kwargs")) == {"enable_thinking": False}
    assert "--enable-metrics" in argv
    assert argv[-2:] == ("--chunked-prefill-size", "4096")     # the user's own arguments last, verbatim
    assert spec.health_path == "/health" and spec.engine_version == "0.5.23"


def test_the_users_own_flag_wins_over_the_typed_setting(tmp_path):
    argv = sglang.render(PY, _opts(tmp_path, ctx=8192, extra_args=("--context-length", "4096"))).argv
    assert argv.count("--context-length") == 1 and argv[-1] == "4096"
    settings = sglang.launch_settings(_opts(tmp_path / "b", ctx=8192, extra_args=("--context-length", "4096")))
    assert settings.ctx == 4096 and settings.kv_unified is True and settings.tp == 1
    settings = engines.adapter("sglang").launch_settings(_opts(tmp_path / "c", tp=2, kv_dtype="f16"), trained_ctx=40960)
    assert (settings.ctx, settings.tp, settings.kv_dtype, settings.parallel) == (40960, 2, "auto", 1)


def test_kv_types_are_translated_and_an_unknown_one_refused_with_the_nearest(tmp_path):
    assert sglang.kv_cache_dtype("f16") == "auto"               # FitRequest's default = the model's dtype
    assert sglang.kv_cache_dtype("fp8_e5m2") == "fp8_e5m2"
    assert sglang.kv_cache_dtype("fp4_e2m1") == "fp4_mx_block16"
    assert sglang.kv_cache_dtype("nvfp4") == "nvfp4"             # SGLang's own name is taken as is
    with pytest.raises(BadInput, match=r"SGLang has no KV cache type 'q8_0'.*it takes auto, fp8_e4m3"):
        sglang.render(PY, _opts(tmp_path, kv_dtype="q8_0"))
    with pytest.raises(BadInput, match=r"nearest: fp8_e4m3"):
        sglang.kv_cache_dtype("fp8_e4m4")


@pytest.mark.parametrize(("method", "draft", "algo", "expect"), [
    ("mtp", None, "NEXTN", ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                            "--speculative-num-draft-tokens", "4"]),
    ("eagle3", "org/drafter", "EAGLE3", ["--speculative-draft-model-path", "org/drafter",
                                         "--speculative-num-steps", "3"]),
    ("eagle", "org/drafter", "EAGLE", ["--speculative-num-draft-tokens", "4"]),
    ("dflash", "z-lab/Qwen3-8B-DFlash", "DFLASH", ["--speculative-num-draft-tokens", "4"]),
    ("ngram", None, "NGRAM", ["--speculative-num-draft-tokens", "3"]),
])
def test_speculative_methods_render_sglangs_algorithm_and_counts(tmp_path, method, draft, algo, expect):
    argv = list(sglang.render(PY, _opts(tmp_path, spec_method=method, spec_tokens=3, draft_model=draft)).argv)
    assert _value(argv, "--speculative-algorithm") == algo
    i = argv.index(expect[0])
    assert argv[i:i + len(expect)] == expect
    if algo in ("DFLASH", "NGRAM"):
        assert "--speculative-num-steps" not in argv


def test_speculative_settings_sglang_cannot_run_are_refused(tmp_path):
    with pytest.raises(BadInput, match=r"no speculative method 'medusa'.*it runs dflash, draft_model, eagle, eagle3"):
        sglang.render(PY, _opts(tmp_path / "a", spec_method="medusa"))
    with pytest.raises(BadInput, match=r"nearest: eagle3"):
        sglang.spec_algorithm("eagle-3")
    with pytest.raises(BadInput, match=r"eagle3 \(EAGLE3\) needs a draft model"):
        sglang.render(PY, _opts(tmp_path / "b", spec_method="eagle3"))
    with pytest.raises(BadInput, match="without a speculative method"):
        sglang.render(PY, _opts(tmp_path / "c", spec_tokens=4))


def test_a_gguf_file_or_a_folder_without_config_is_refused(tmp_path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 60)
    with pytest.raises(BadInput, match=r"is a GGUF file; SGLang serves a Hugging Face model folder.*llama\.cpp"):
        sglang.render(PY, LaunchOptions(model_path=gguf))
    (tmp_path / "empty").mkdir()
    assert "has no config.json" in (sglang.loads_refusal(tmp_path / "empty") or "")
    assert engines.adapter("sglang").loads_refusal(gguf) == sglang.loads_refusal(gguf)
    # a hub repo id (no local path) is SGLang's to resolve
    assert sglang.render(PY, LaunchOptions(model_path=Path("Qwen/Qwen3-8B"))).argv[4] == "Qwen/Qwen3-8B"


def test_a_random_weight_folder_is_served_with_dummy_loading_and_a_real_gguf_stays_refused(tmp_path):
    """serving_model turns only engineroom's random-weight GGUF into a folder (a real GGUF is left for render to
    refuse); a folder engineroom wrote of random weights is launched with --load-format dummy, unless the user
    gave a load format."""
    from engineroom.engines.hffolder import SOURCE_FILE

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 60)
    assert sglang.serving_model(gguf, weights_format="awq") == gguf
    from engineroom.catalog import arch_from_catalog, load_catalog
    from engineroom.synth import write_synthetic_gguf

    shape = write_synthetic_gguf(arch_from_catalog(load_catalog().model("smollm2-135m")), "F16",
                                 tmp_path / "shape.gguf", tensors=False)
    assert sglang.loads_refusal(shape) is None and "is a GGUF file" in (sglang.loads_refusal(gguf) or "")
    assert engines.adapter("sglang").serving_model(tmp_path) == tmp_path
    folder = _model_dir(tmp_path / "dummy")
    (folder / SOURCE_FILE).write_text(json.dumps({"dtype": "float16", "weights": "dummy"}))
    assert _value(sglang.render(PY, LaunchOptions(model_path=folder)).argv, "--load-format") == "dummy"
    mine = sglang.render(PY, LaunchOptions(model_path=folder, extra_args=("--load-format", "auto"))).argv
    assert list(mine).count("--load-format") == 1 and _value(mine, "--load-format") == "auto"
    assert "--load-format" not in sglang.render(PY, _opts(tmp_path / "real")).argv


def test_sglang_builds_a_checkpoints_vision_tower_unless_its_architecture_is_served_text_only(tmp_path):
    """SGLang has no text-only launch for Qwen3.5/3.6 (its --language-only is a worker of encoder disaggregation):
    the tower is built whatever the pick's vision, and launch_settings says so, for fit to size it. The
    architectures SGLang serves text-only unless asked (Gemma 3, Llama 4) get --enable-multimodal when the pick
    serves images. A random-weight folder of a vision model skips SGLang's image warmup (its tokenizer, the shape
    file's vocabulary, has no image tokens to place); a real one keeps it."""
    from engineroom.engines.hffolder import SOURCE_FILE

    def folder(name: str, arch: str, vision: bool, dummy: bool) -> Path:
        d = tmp_path / name
        d.mkdir()
        config = {"architectures": [arch], "model_type": name, **({"vision_config": {"depth": 2}} if vision else {})}
        (d / "config.json").write_text(json.dumps(config))
        if dummy:
            (d / SOURCE_FILE).write_text(json.dumps({"dtype": "float16", "weights": "dummy"}))
        return d

    qwen = folder("qwen3_5", "Qwen3_5ForConditionalGeneration", True, True)
    for asked in (None, False, True):
        opts = LaunchOptions(model_path=qwen, ctx=4096, vision=asked)
        assert sglang.launch_settings(opts).vision is True
        argv = sglang.render(PY, opts).argv
        assert "--skip-server-warmup" in argv and "--enable-multimodal" not in argv
    real = folder("qwen3_5_real", "Qwen3_5ForConditionalGeneration", True, False)
    assert "--skip-server-warmup" not in sglang.render(PY, LaunchOptions(model_path=real)).argv
    assert sglang.launch_settings(LaunchOptions(model_path=real, vision=False)).vision is True
    gemma = folder("gemma3", "Gemma3ForConditionalGeneration", True, False)
    assert sglang.launch_settings(LaunchOptions(model_path=gemma, vision=False)).vision is False
    assert "--enable-multimodal" not in sglang.render(PY, LaunchOptions(model_path=gemma, vision=False)).argv
    asked = LaunchOptions(model_path=gemma, vision=True)
    assert sglang.launch_settings(asked).vision is True and "--enable-multimodal" in sglang.render(PY, asked).argv
    text = folder("qwen3", "Qwen3ForCausalLM", False, True)
    assert sglang.launch_settings(LaunchOptions(model_path=text)).vision is False
    assert "--skip-server-warmup" not in sglang.render(PY, LaunchOptions(model_path=text)).argv
    # a hub id (no config here): what the launch asks
    assert sglang.launch_settings(LaunchOptions(model_path=tmp_path / "org" / "repo", vision=True)).vision is True


def test_bad_host_mem_fraction_and_template_are_refused(tmp_path):
    with pytest.raises(BadInput, match="binds engines to 127.0.0.1, not 0.0.0.0"):
        sglang.render(PY, _opts(tmp_path / "a", host="0.0.0.0"))
    with pytest.raises(BadInput, match="between 0 and 1"):
        sglang.render(PY, _opts(tmp_path / "b", mem_fraction=1.5))
    with pytest.raises(BadInput, match="does not exist"):
        sglang.render(PY, _opts(tmp_path / "c", chat_template=tmp_path / "nope.jinja"))


def test_placeholder_binary_renders_a_recipe_and_find_binary_refuses_a_bad_path(tmp_path, monkeypatch):
    spec = engines.adapter("sglang").render(sglang.placeholder_binary(), _opts(tmp_path))
    assert spec.argv[:3] == ("python", "-m", "sglang.launch_server")
    with pytest.raises(NotFound, match="is not an executable file"):
        sglang.find_binary(tmp_path / "no-python")
    monkeypatch.delenv(sglang.ENV_BINARY, raising=False)
    monkeypatch.setenv("ENGINEROOM_DATA_DIR", str(tmp_path / "empty-data"))
    with pytest.raises(NotFound, match="engineroom engines install sglang"):
        sglang.find_binary()


# --------------------------------------------------------------------------- API key
def test_the_api_key_never_reaches_argv_and_the_shim_hands_it_over_in_process(tmp_path):
    """SGLang reads its key from --api-key only; the shim reads the 0600 file and passes it in-process.

    Run for real with a stand-in ``sglang.launch_server`` module that reports what it received and
    logs the key the way SGLang logs its server_args."""
    key = "sk-test-0123456789abcdef"
    key_file = tmp_path / "key"
    key_file.write_text("# engineroom key\n" + key + "\n")
    key_file.chmod(0o600)
    spec = sglang.render(PY, _opts(tmp_path, api_key_file=key_file))
    assert key not in " ".join(spec.argv) and "--api-key" not in spec.argv
    assert sglang.api_key_file_in(spec.argv) == str(key_file)
    assert engines.adapter("sglang").api_key_file_in(spec.argv) == str(key_file)
    assert sglang.server_args(spec.argv)[-2:] == ["--api-key", "<key read from the file>"]
    fake = tmp_path / "fake" / "sglang"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "launch_server.py").write_text(
        "import json, logging, sys\n"
        "logging.basicConfig(level=logging.INFO, force=True)\n"
        "logging.getLogger('sglang').info('server_args=%s', {'api_key': sys.argv[-1]})\n"
        "cmd = open('/proc/self/cmdline', 'rb').read().decode().split('\\0')\n"
        "print(json.dumps({'argv': sys.argv, 'cmdline_has_key': sys.argv[-1] in ' '.join(cmd)}))\n")
    proc = subprocess.run(list(spec.argv), capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(fake.parent)})
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["argv"][-2:] == ["--api-key", key] and got["argv"][1:3] == ["--model-path", str(tmp_path / "Qwen3-8B")]
    assert got["cmdline_has_key"] is False                  # /proc/PID/cmdline holds the file's path only
    assert key not in proc.stderr and "<redacted>" in proc.stderr   # SGLang's own log line is masked


def test_a_key_among_the_engine_arguments_is_split_out_or_refused(tmp_path):
    rest, key, key_file = sglang.split_api_key(["--api-key", "abc123", "--api-key-file=/k", "--x"])
    assert (rest, key, key_file) == (["--x"], "abc123", "/k")
    with pytest.raises(BadInput, match="would sit on SGLang's command line"):
        sglang.render(PY, _opts(tmp_path, extra_args=("--api-key=abc123",)))


# --------------------------------------------------------------------------- multi-node
def test_render_cluster_gives_one_command_per_node(tmp_path):
    specs = engines.adapter("sglang").render_cluster(PY, _opts(tmp_path, ctx=32768), nodes=2, gpus_per_node=8,
                                                     head_addr="192.0.2.10")
    assert len(specs) == 2
    for rank, spec in enumerate(specs):
        argv = spec.argv
        assert _value(argv, "--tp-size") == "16" and argv.count("--tp-size") == 1 and "--pp-size" not in argv
        assert _value(argv, "--nnodes") == "2" and _value(argv, "--node-rank") == str(rank)
        assert _value(argv, "--dist-init-addr") == "192.0.2.10:20000"
        assert _value(argv, "--host") == "127.0.0.1"          # the HTTP server stays on loopback
        assert _value(argv, "--context-length") == "32768"
        assert spec.node == rank and spec.role.startswith(f"rank {rank}")
    piped = sglang.render_cluster(PY, _opts(tmp_path / "p"), nodes=2, gpus_per_node=8, head_addr="2001:db8::1",
                                  dist_port=25000, pipeline=True)
    assert [(_value(s.argv, "--tp-size"), _value(s.argv, "--pp-size")) for s in piped] == [("8", "2"), ("8", "2")]
    assert _value(piped[1].argv, "--dist-init-addr") == "[2001:db8::1]:25000"


def test_render_cluster_refuses_what_cannot_form_a_cluster(tmp_path):
    opts = _opts(tmp_path)
    with pytest.raises(BadInput, match="loopback"):
        sglang.render_cluster(PY, opts, nodes=2, gpus_per_node=8, head_addr="127.0.0.1")
    with pytest.raises(BadInput, match="without a port"):
        sglang.render_cluster(PY, opts, nodes=2, gpus_per_node=8, head_addr="head:25000")
    with pytest.raises(BadInput, match="tp 4 does not match the cluster: 2 nodes x 8 GPUs run tp 16"):
        sglang.render_cluster(PY, LaunchOptions(model_path=opts.model_path, tp=4), nodes=2, gpus_per_node=8,
                              head_addr="head-node")
    with pytest.raises(BadInput, match="--node-rank among the engine arguments"):
        sglang.render_cluster(PY, LaunchOptions(model_path=opts.model_path, extra_args=("--node-rank", "1")),
                              nodes=2, gpus_per_node=8, head_addr="head-node")
    with pytest.raises(NotFound, match="has no multi-node recipe"):
        engines.adapter("llama.cpp").render_cluster(None, opts, nodes=2, gpus_per_node=1, head_addr="head-node")


# --------------------------------------------------------------------------- the running server
def test_health_and_failure_classification():
    assert [sglang.health_state(c) for c in (None, 503, 200, 500)] == ["starting", "loading", "ready", "error"]
    cases = {
        "sglang serve: error: unrecognized arguments: --context-lenght 4096": "bad flag",
        "sglang serve: error: argument --kv-cache-dtype: invalid choice: 'fp9' (choose from 'auto', ...)": "bad flag",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB": "out of memory",
        "RuntimeError: No CUDA GPUs are available": "no GPU",
        "OSError: [Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): address already in use":
            "port already in use",
        "ValueError: DFLASH speculative decoding requires setting --speculative-draft-model-path.":
            "speculative decoding not possible with these settings",
        "nothing recognisable": "unknown (see the log lines above)",
    }
    assert {line: sglang.classify_failure(line) for line in cases} == cases


def test_metrics_from_a_sample_written_from_sglangs_metric_names():
    got = engines.adapter("sglang").impl.normalise_metrics(FIXTURE_METRICS.read_text())
    assert got == {
        "prompt_tokens_total": 1500.0, "generated_tokens_total": 768.0, "prompt_cached_tokens_total": 375.0,
        "requests_total": 3.0, "spec_verify_calls_total": 270.0,
        "requests_running": 4.0, "requests_waiting": 1.0,                  # summed over the TP ranks
        "ttft_seconds_sum": pytest.approx(0.6), "ttft_seconds_count": 3.0,
        "inter_token_seconds_sum": 5.1, "inter_token_seconds_count": 765.0,
        "e2e_seconds_sum": 6.3, "e2e_seconds_count": 3.0,
        "kv_cache_usage_ratio": pytest.approx(0.13), "prefix_cache_hit_rate": 0.25,   # averaged over ranks
        "spec_accept_length": 2.8, "spec_accept_rate": 0.6, "generated_tokens_per_second": 150.0,
    }
    assert sglang.normalise_metrics("this is { not prometheus") == {}


def test_server_info_from_sglangs_answers_and_probe_of_a_closed_port():
    info = sglang.server_info("http://127.0.0.1:30000",
                              {"model_path": "/m/Qwen3-8B", "is_generation": True, "served_model_name": "qwen3-8b",
                               "tool_call_parser": "qwen3_coder", "reasoning_parser": None,
                               "has_image_understanding": False, "model_type": "qwen3"},
                              {"version": "0.5.23", "context_length": 32768, "max_running_requests": 8}, "")
    assert (info.engine, info.engine_version, info.model_id, info.n_ctx, info.total_slots) == \
        ("sglang", "0.5.23", "qwen3-8b", 32768, 8)
    caps = info.capabilities
    assert (caps.tools, caps.reasoning, caps.vision, caps.json_schema) == (True, False, False, True)
    assert caps.full_length_body == {"ignore_eos": True}
    import socket

    with socket.socket() as s:          # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert sglang.probe(f"http://127.0.0.1:{port}", timeout=2) is None


# --------------------------------------------------------------------------- SGLang's own parser
def _reports(binary: sglang.Binary, argvs) -> list[dict]:
    """SGLang's parser on ``argvs``; SKIP with SGLang's own message when it does not import here."""
    try:
        return sglang.validation_reports(binary, argvs)
    except NotFound as exc:
        pytest.skip(str(exc))


def _full_options(tmp_path: Path, **kw) -> LaunchOptions:
    return _opts(tmp_path, **{"ctx": 16384, "parallel": 8, "tp": 2, "kv_dtype": "fp8_e4m3", "mem_fraction": 0.85,
                              "tool_parser": "qwen3_coder", "reasoning_parser": "qwen3", "thinking": False, **kw})


SPEC_METHODS = [("mtp", None), ("eagle", "org/eagle"), ("eagle3", "org/eagle3"), ("dflash", "z-lab/Qwen3-8B-DFlash"),
                ("ngram", None)]


def _random_folder(binary: sglang.Binary, tmp: Path) -> Path:
    """The folder SGLang serves for a random-weight file of SmolLM2's shape at awq-int4 (``serving_model``: its
    config and tokenizer, written by transformers in SGLang's own environment, with AWQ's quantization_config)."""
    from engineroom.catalog import arch_from_catalog, load_catalog
    from engineroom.synth import write_synthetic_gguf

    arch = arch_from_catalog(load_catalog().model("smollm2-135m"))
    shape = write_synthetic_gguf(arch, "F16", tmp / "shape" / "smollm2-F16-random.gguf", tensors=False)
    with pytest.MonkeyPatch.context() as mp:      # serving_model finds SGLang as a launch does: here, this one
        mp.setenv(sglang.ENV_BINARY, str(binary.python))
        return sglang.serving_model(shape, weights_format="awq")


def _vision_folder(binary: sglang.Binary, tmp: Path) -> Path:
    """The folder SGLang serves for a random-weight file of the Qwen3.6-27B layout (its own config.json carried, the
    vision tower's config with it) at awq-int4, written in SGLang's own environment."""
    from engineroom.arch.config import arch_from_config, read_config
    from engineroom.synth import write_synthetic_gguf

    config = Path(__file__).parent / "fixtures" / "configs" / "qwen3.6-27b.json"
    shape = write_synthetic_gguf(arch_from_config(config), "F16", tmp / "shape" / "qwen3.6-27b-F16-random.gguf",
                                 tensors=False, hf_config=read_config(config)[0])
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(sglang.ENV_BINARY, str(binary.python))
        return sglang.serving_model(shape, weights_format="awq")


@pytest.fixture(scope="module")
def parser_reports(sglang_binary, tmp_path_factory) -> dict[str, list[dict]]:
    """SGLang's own parser on every command line the tests below ask about, in ONE interpreter
    (`validation_reports`: SGLang's import is the cost): name -> the reports of its command lines, in
    order; SKIP with SGLang's own message when it does not import here."""
    tmp = tmp_path_factory.mktemp("sglang-parser")
    key_file = tmp / "key"
    key_file.write_text("sk-cluster-key-0000\n")
    key_file.chmod(0o600)
    layouts = [sglang.render_cluster(sglang_binary, _full_options(tmp / str(pipeline), tp=1, api_key_file=key_file),
                                     nodes=2, gpus_per_node=8, head_addr="head-node", pipeline=pipeline)
               for pipeline in (False, True)]
    broken = list(layouts[0][1].argv)
    broken[broken.index("--node-rank")] = "--node-rnak"
    batches = {
        "rendered": [sglang.render(sglang_binary, _full_options(tmp / "full", extra_args=(
            "--chunked-prefill-size", "4096"))).argv],
        "good and bad": [sglang.render(sglang_binary, _opts(tmp / name, extra_args=extra)).argv for name, extra in (
            ("ok", ()), ("a", ("--context-lenght", "4096")), ("b", ("--kv-cache-dtype", "fp9")),
            ("c", ("--tp-size", "two")))],
        "speculative": [sglang.render(sglang_binary, _full_options(tmp / m, spec_method=m, spec_tokens=3,
                                                                   draft_model=d)).argv for m, d in SPEC_METHODS],
        "cluster": [s.argv for specs in layouts for s in specs] + [broken],
        "random weights": [sglang.render(sglang_binary, LaunchOptions(
            model_path=_random_folder(sglang_binary, tmp), ctx=2048, quant_format="awq")).argv],
        "random vision weights": [sglang.render(sglang_binary, LaunchOptions(
            model_path=_vision_folder(sglang_binary, tmp), ctx=32768, quant_format="awq", vision=False)).argv],
    }
    t0 = time.monotonic()
    reports = _reports(sglang_binary, [argv for argvs in batches.values() for argv in argvs])
    print(f"\nSGLang parser check of {len(reports)} command lines: {time.monotonic() - t0:.1f} s wall "
          f"({reports[0].get('import_seconds')} s import)")
    out, at = {}, 0
    for name, argvs in batches.items():
        out[name], at = reports[at:at + len(argvs)], at + len(argvs)
    return out


def test_sglangs_parser_accepts_the_rendered_command_line(parser_reports):
    [report] = parser_reports["rendered"]
    assert report["parsed"] and report["constructed"], report
    assert report["sglang_version"] == sglang.VERSION
    v = report["values"]
    assert v["model_path"].endswith("/full/Qwen3-8B"), v["model_path"]
    assert (v["host"], v["port"], v["context_length"], v["max_running_requests"], v["tp_size"],
            v["kv_cache_dtype"], v["mem_fraction_static"], v["enable_metrics"], v["chunked_prefill_size"]) == \
        ("127.0.0.1", 30001, 16384, 8, 2, "fp8_e4m3", 0.85, True, 4096)
    assert (v["tool_call_parser"], v["reasoning_parser"], v["served_model_name"]) == \
        ("qwen3_coder", "qwen3", "qwen3-8b")
    assert any("resolve_once" in n for n in report["not_checked"])


def test_sglangs_parser_rejects_a_misspelt_flag_a_bad_choice_and_a_bad_type(parser_reports):
    ok, misspelt, bad_choice, bad_type = parser_reports["good and bad"]
    assert ok["parsed"] and ok["constructed"], ok
    assert not misspelt["parsed"] and "unrecognized arguments: --context-lenght 4096" in misspelt["rejected"]
    assert not bad_choice["parsed"] and "invalid choice: 'fp9'" in bad_choice["rejected"]
    assert not bad_type["parsed"] and "invalid int value: 'two'" in bad_type["rejected"]


def test_sglangs_parser_accepts_each_speculative_rendering(parser_reports):
    for (method, draft), report in zip(SPEC_METHODS, parser_reports["speculative"], strict=True):
        assert report["parsed"] and report["constructed"], report
        v = report["values"]
        assert v["speculative_algorithm"] == sglang.spec_algorithm(method)
        assert v["speculative_draft_model_path"] == draft
        assert v["speculative_num_draft_tokens"] == (3 if method == "ngram" else 4)


def test_sglangs_parser_accepts_every_node_of_a_cluster_and_the_key_shim(parser_reports):
    reports = parser_reports["cluster"]
    for i, report in enumerate(reports[:4]):
        pipeline, rank = i >= 2, i % 2
        assert report["parsed"] and report["constructed"], report
        v = report["values"]
        assert (v["nnodes"], v["node_rank"], v["dist_init_addr"]) == (2, rank, "head-node:20000")
        assert (v["tp_size"], v["pp_size"]) == ((8, 2) if pipeline else (16, 1))
        assert v["api_key"] == "<key read from the file>"
    assert not reports[4]["parsed"] and "unrecognized arguments: --node-rnak" in reports[4]["rejected"]


def test_the_installed_version_is_the_pinned_one(sglang_binary):
    assert sglang.binary_version(sglang_binary) == sglang.VERSION


def test_sglang_serves_a_random_weight_file_as_a_folder_it_makes_the_weights_of(parser_reports):
    """try / bakeoff --random on SGLang: the shape-only file's folder (written in SGLang's env) carries AWQ's
    quantization_config at the group SmolLM2's 576 allows, and SGLang's own parser takes --load-format dummy."""
    from engineroom.engines.hffolder import SOURCE_FILE

    [report] = parser_reports["random weights"]
    assert report["parsed"] and report["constructed"], report
    v = report["values"]
    assert v["load_format"] == "dummy", v
    folder = Path(v["model_path"])
    whole = json.loads((folder / "config.json").read_text())
    config = whole["quantization_config"]
    assert (config["quant_method"], config["bits"], config["group_size"]) == ("awq", 4, 64), config
    # the class a checkpoint's config names (transformers' reading of GGUF metadata leaves it out; SGLang 0.5.23's
    # ModelConfig indexes it: "'NoneType' object is not subscriptable" without)
    assert whole["architectures"] == ["LlamaForCausalLM"], whole.get("architectures")
    assert json.loads((folder / SOURCE_FILE).read_text())["weights"] == "dummy"
    assert (folder / "tokenizer.json").is_file() or (folder / "tokenizer_config.json").is_file()
    assert "--load-format dummy" in (sglang.random_weights_loading("awq") or "")
    assert sglang.random_weights_loading("fp8") is None
    assert sglang.launch_settings(LaunchOptions(model_path=folder, quant_format="awq")).quant == "awq-int4"


def test_a_random_vision_folder_has_the_processor_sglang_loads_before_it_serves(parser_reports, sglang_binary):
    """SGLang loads a multimodal model's processor before it serves (AutoProcessor, then the image processor from
    the folder's preprocessor_config.json): the Qwen3.6-27B layout's random-weight folder had none and SGLang 0.5.16
    stopped at start on the H100 ("Can't load image processor", 2026-12-06). The folder now has the processor of
    the model's type, written by SGLang's own transformers at the tower's patch and merge sizes; SGLang's own
    get_processor reads it, and the vocabulary's files stay the shape file's (the processor's are not kept with
    them for another model of that vocabulary). The command line skips SGLang's image warmup, and its parser
    takes it."""
    [report] = parser_reports["random vision weights"]
    assert report["parsed"] and report["constructed"], report
    v = report["values"]
    assert (v["load_format"], v["skip_server_warmup"], v["context_length"]) == ("dummy", True, 32768), v
    folder = Path(v["model_path"])
    assert (folder / "preprocessor_config.json").is_file()
    check = ("import json, sys\n"
             "from sglang.srt.utils.hf_transformers_utils import get_processor\n"
             "p = get_processor(sys.argv[1])\n"
             "i = p.image_processor\n"
             "print(json.dumps([type(p).__name__, i.patch_size, i.merge_size, i.temporal_patch_size, "
             "len(p.tokenizer)]))\n")
    proc = subprocess.run([str(sglang_binary.python), "-c", check, str(folder)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    name, patch, merge, temporal, vocab = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (name, patch, merge, temporal, vocab) == ("Qwen3VLProcessor", 16, 2, 2, 248_320)
    kept = [p for d in (folder.parent / "tokenizers").iterdir() for p in d.iterdir()]
    assert kept and not [p.name for p in kept if "processor" in p.name], kept
    assert sglang.launch_settings(LaunchOptions(model_path=folder, quant_format="awq", vision=False)).vision


def test_a_float16_hybrid_keeps_its_conv_state_at_float16_by_sglangs_own_reading(parser_reports, sglang_binary):
    """The Qwen3.6-27B layout's random-weight folder runs at float16 (as most AWQ checkpoints do), and SGLang keeps a
    linear-attention layer's conv state at bfloat16 unless told: on the H100 (2026-12-06, SGLang 0.5.16) its Triton
    conv kernel then failed to compile ("Mismatched type for col0 ... bf16 ... fp16") at the first request, after a
    430 s start. The rendered launch sets SGLANG_MAMBA_CONV_DTYPE=float16 and says why; SGLang's own ModelConfig and
    mamba2_state_dtype read the folder at float16 activations and, under the launch's environment, a float16 state
    (bfloat16 without it: the crash's precondition). A bfloat16 launch, or a user's own setting, is left alone."""
    [report] = parser_reports["random vision weights"]
    folder = Path(report["values"]["model_path"])
    spec = sglang.render(sglang_binary, LaunchOptions(model_path=folder, ctx=32768, quant_format="awq"))
    assert spec.env.get(sglang.CONV_DTYPE_ENV) == "float16", spec.env
    assert any(n.startswith(f"{sglang.CONV_DTYPE_ENV}=float16") and "48 linear-attention" in n for n in spec.notes)
    check = ("import sys\n"
             "from sglang.srt.configs.model_config import ModelConfig\n"
             "from sglang.srt.configs.mamba_utils import mamba2_state_dtype\n"
             "m = ModelConfig(sys.argv[1])\n"
             "print(m.dtype, mamba2_state_dtype(m.hf_config).conv)\n")
    seen = {}
    for name, env in (("launch", spec.env), ("unset", {})):
        base = {k: v for k, v in os.environ.items() if k != sglang.CONV_DTYPE_ENV}
        proc = subprocess.run([str(sglang_binary.python), "-c", check, str(folder)], capture_output=True, text=True,
                              timeout=600, env={**base, **env, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""})
        assert proc.returncode == 0, proc.stderr[-2000:]
        seen[name] = proc.stdout.strip().splitlines()[-1]
    assert seen == {"launch": "torch.float16 torch.float16", "unset": "torch.float16 torch.bfloat16"}, seen
    bf16 = sglang.render(sglang_binary, LaunchOptions(model_path=folder, quant_format="awq",
                                                      extra_args=("--dtype", "bfloat16")))
    assert sglang.CONV_DTYPE_ENV not in bf16.env and not bf16.notes


def test_the_share_engineroom_passes_never_exceeds_the_one_sglang_would_take(parser_reports, sglang_binary):
    """engineroom passes --mem-fraction-static at the share fit sized (``StaticShare``, SGLang's own rule as 0.5.16
    applies it); SGLang 0.5.23, asked for a launch without one, takes by its rule at each GPU size (its
    ServerArgs resolved with the device's capacity given, the GPU size being all the rule reads of the machine):
    engineroom's share is never larger, so the activations and graphs keep at least the reserve SGLang itself
    keeps, and at most 0.03 smaller (0.5.23 caps the decode graphs by --max-running-requests: a smaller reserve)."""
    from engineroom.fit.engine import engine_spec
    from engineroom.fit.pool import static_share

    [report] = parser_reports["random weights"]
    folder = report["values"]["model_path"]
    sizes = (16_384, 24_576, 40_960, 49_152, 81_559, 144_384, 196_608)      # MiB, as SGLang reads them
    check = ("import json, sys\n"
             "import sglang.srt.arg_groups.memory_hook as hook\n"
             "from sglang.srt.server_args import ServerArgs\n"
             "out = {}\n"
             "for mib in json.loads(sys.argv[2]):\n"
             "    hook.get_device_memory_capacity = lambda device=None, mib=mib: mib\n"
             "    args = ServerArgs(model_path=sys.argv[1], device='cuda', load_format='dummy', context_length=4096,\n"
             "                      max_running_requests=1)\n"
             "    args.resolve_once()\n"
             "    out[mib] = args.resolved_dict()['mem_fraction_static']\n"
             "print(json.dumps(out))\n")
    proc = subprocess.run([str(sglang_binary.python), "-c", check, folder, json.dumps(sizes)], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    own = {int(k): v for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}
    rule = engine_spec("sglang").static_share
    assert rule is not None
    ours = {mib: static_share(rule, mib << 20) for mib in sizes}
    assert all(own[m] - 0.03 <= ours[m] <= own[m] for m in sizes), (ours, own)


def test_only_a_float16_model_with_linear_attention_gets_the_conv_state_setting(tmp_path, monkeypatch):
    """Which launches carry SGLANG_MAMBA_CONV_DTYPE: the activations' dtype is SGLang's reading of the text config
    (a float32 or unnamed one runs at float16, Gemma's at bfloat16; --dtype wins), and only a model with recurrent
    layers has a conv state. The user's own environment setting is theirs."""
    qwen36 = json.loads((Path(__file__).parent / "fixtures" / "configs" / "qwen3.6-27b.json").read_text())
    assert sglang.activation_dtype(qwen36) == "bfloat16"
    assert sglang.activation_dtype(qwen36, ["--dtype", "half"]) == "float16"
    assert sglang.activation_dtype({"model_type": "llama"}) == "float16"
    assert sglang.activation_dtype({"model_type": "gemma3", "torch_dtype": "float32"}) == "bfloat16"

    def folder(name: str, config: dict) -> Path:
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(config))
        return d

    fp16 = folder("fp16", {**qwen36, "text_config": {**qwen36["text_config"], "dtype": "float16"}})
    dense = folder("dense", {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "torch_dtype": "float16",
                             "hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8,
                             "num_key_value_heads": 4, "intermediate_size": 2048, "vocab_size": 1000})
    monkeypatch.delenv(sglang.CONV_DTYPE_ENV, raising=False)
    assert sglang.conv_state_env(fp16)[0] == {sglang.CONV_DTYPE_ENV: "float16"}
    assert sglang.conv_state_env(fp16, ["--dtype", "bfloat16"]) == ({}, ())
    assert sglang.conv_state_env(folder("bf16", qwen36)) == ({}, ())
    assert sglang.conv_state_env(dense) == ({}, ())
    assert sglang.conv_state_env(tmp_path / "no-such-folder") == ({}, ())
    monkeypatch.setenv(sglang.CONV_DTYPE_ENV, "bfloat16")
    assert sglang.conv_state_env(fp16) == ({}, ())


def test_a_record_that_needs_an_accelerator_to_build_is_the_machines_limit_not_the_command_lines(tmp_path):
    """SGLang 0.5.16's ServerArgs asks for an accelerator as it builds ("No accelerator (CUDA, ...) is
    available"), and the check hides the GPUs: every command line would be REJECTED, and `up` and `try` refused on
    the GPU machine itself. The parser's check stands and the record is said not checked; a flag the parser refuses
    is still refused. SGLang 0.5.23 (CI's) builds its record without a GPU, so a stand-in plays 0.5.16's
    ServerArgs here: StandInServerArgs0516, with its parser's two flags and its refusal to build."""
    from engineroom.engines.sglang import validate
    from engineroom.engines.sglang.discovery import Binary

    pkg = tmp_path / "sglang" / "srt"
    pkg.mkdir(parents=True)
    (tmp_path / "sglang" / "__init__.py").write_text("__version__ = '0.5.16-stand-in'\n")
    (pkg / "__init__.py").write_text("")
    (pkg / "server_args.py").write_text(
        "class ServerArgs:  # StandInServerArgs0516\n"
        "    @staticmethod\n"
        "    def add_cli_args(parser):\n"
        "        parser.add_argument('--model-path')\n"
        "        parser.add_argument('--sampling-backend', choices=['pytorch', 'flashinfer'])\n"
        "    @classmethod\n"
        "    def from_cli_args(cls, ns):\n"
        "        raise RuntimeError('No accelerator (CUDA, XPU, HPU, NPU, MUSA, MPS) or platform plugin '\n"
        "                           'is available.')\n")
    binary = Binary(python=Path(sys.executable), origin="--engine-bin", env={"PYTHONPATH": str(tmp_path)})
    head = ["python", "-m", "sglang.launch_server", "--model-path", "/m"]
    ok, bad = validate.validation_reports(binary, [[*head, "--sampling-backend", "pytorch"],
                                                    [*head, "--sampling-backend", "bogus"]])
    assert ok["parsed"] and not ok["constructed"] and "construct_error" not in ok, ok
    assert any("needs an accelerator" in n for n in ok["not_checked"]), ok
    assert validate.validate_many(binary, [[*head, "--sampling-backend", "pytorch"]]) == [None]
    (why,) = validate.validate_many(binary, [[*head, "--sampling-backend", "bogus"]])
    assert not bad["parsed"] and why and "invalid choice: 'bogus'" in why, why


def test_a_long_start_says_what_sglang_is_doing_and_waits_as_long_as_vllms():
    """SGLang's start on an H100 (its own logs): loading, the pools, then CUDA-graph captures, a 27B layout's
    longer than the 300 s default wait (three tries stopped in their first capture). The wait is 900 s, and
    the progress line names the last thing SGLang logged, its time stamp off, warnings skipped."""
    root = Path(__file__).parent / "fixtures" / "sglang"
    assert engines.adapter("sglang").start_timeout == 900.0
    text = (root / "h100_qwen36_27b_awq_start.log").read_text()
    assert sglang.wait_hint(text[:text.index("[2026-12-06 03:20:06] Memory pool end")]) == (
        "KV Cache is allocated. dtype: torch.float16, #tokens: 368379, K size: 11.24 GB, V size: 11")
    live = text[:text.index("/usr/lib/python3.12/multiprocessing")]      # before the stop wrote its warning
    assert (sglang.wait_hint(live) or "").startswith("Capturing num tokens (num_tokens=8192")
    assert sglang.wait_hint("[2026-12-06 03:19:25] Ignore import error when loading x: No module named 'y'\n") is None


def test_a_missing_image_processor_is_the_model_folder_not_a_missing_package():
    """SGLang 0.5.16 on the Qwen3.6-27B layout's random-weight folder (an H100, 2026-12-06: the log as it came back):
    its notes on optional processors ("Ignore import error when loading ...: No module named 'helion'") made the
    failure read "missing Python package"; the failure is transformers finding no preprocessor_config.json."""
    log = (Path(__file__).parent / "fixtures" / "sglang" / "image_processor_missing.log").read_text()
    assert "No module named 'helion'" in log
    assert sglang.classify_failure(log) == "model could not be loaded"
    assert sglang.classify_failure("[t] Ignore import error when loading a.b: No module named 'c'\n"
                                   "ModuleNotFoundError: No module named 'sgl_kernel'\n") == "missing Python package"
