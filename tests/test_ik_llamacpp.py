"""The ik_llama.cpp adapter: built by `engineroom engines install ik_llama.cpp`, driven for real.

Unit tests read what the real fork said (tests/fixtures/ik_llamacpp/: its --help, /props,
/health, /metrics, a response's timings, its start-up and failure logs, and mainline
llama-server's /props for the contrast; captured from the 0.1.5 build with SmolLM2, see the
folder's README). The integration tests build (or reuse) the fork through the CLI, then run
up -> verify (smoke, full, stress --fast, a quick soak, toolstream) -> bench on one real start.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

import pytest

from engineroom import engines, paths
from engineroom.engines import ikllamacpp as ik
from engineroom.engines import llamacpp
from engineroom.engines.base import UNKNOWN_FAILURE, DecodeWindow, LaunchOptions, Settled
from engineroom.errors import BadInput, NotFound

from conftest import assert_ok_or_invalid_on_the_machine_alone, cli

FIX = Path(__file__).parent / "fixtures" / "ik_llamacpp"


def _fix(name: str) -> str:
    return (FIX / name).read_text()


def _model(tmp_path: Path) -> Path:
    p = tmp_path / "m.gguf"
    p.write_bytes(b"GGUF" + b"\0" * 60)
    return p


# --------------------------------------------------------------------------- render (no binary)
def test_render_passes_the_forks_defaults_explicitly(tmp_path):
    spec = ik.render(ik.placeholder_binary(), LaunchOptions(model_path=_model(tmp_path), model_name="m", port=8123,
                                                            ctx=1024, parallel=2, threads=2))
    argv = list(spec.argv)
    assert spec.engine == "ik_llama.cpp" and spec.host == "127.0.0.1"
    assert argv[argv.index("-c") + 1] == "2048"          # -c is the whole buffer: ctx x slots
    assert argv[argv.index("-np") + 1] == "2"
    assert "--jinja" in argv                             # off by default in the fork: tool calls need it
    assert "--kv-unified" not in argv and "--no-kv-unified" not in argv and "-lv" not in argv  # mainline-only
    one = ik.render(ik.placeholder_binary(), LaunchOptions(model_path=_model(tmp_path), ctx=512))
    assert one.argv[one.argv.index("-np") + 1] == "1" and one.argv[one.argv.index("-c") + 1] == "512"


def test_render_takes_the_forks_kv_types_and_refuses_others(tmp_path):
    for kv in ("q6_0", "q8_KV", "q8_0"):
        argv = list(ik.render(ik.placeholder_binary(),
                              LaunchOptions(model_path=_model(tmp_path), kv_dtype=kv)).argv)
        assert argv[argv.index("-ctk") + 1] == kv and argv[argv.index("-ctv") + 1] == kv
    with pytest.raises(BadInput, match="ik_llama.cpp has no KV cache type 'fp8'"):
        ik.render(ik.placeholder_binary(), LaunchOptions(model_path=_model(tmp_path), kv_dtype="fp8"))
    with pytest.raises(BadInput, match="split mode is one of none, layer, attn, graph"):
        ik.render(ik.placeholder_binary(), LaunchOptions(model_path=_model(tmp_path), extra_args=("-sm", "row")))


def test_a_gpu_build_is_told_to_put_every_layer_on_the_gpu(tmp_path):
    """The fork offloads no layer unless asked (mainline offloads all): a CUDA build without -ngl served an H200
    pick from the CPU. A GPU build (the manifest `engines install --cuda` writes, or a recipe's stand-in for an
    NVIDIA machine) gets -ngl 999; a CPU build none; the user's own -ngl wins."""
    from engineroom.engines.ikllamacpp.discovery import Binary

    opts = LaunchOptions(model_path=_model(tmp_path), ctx=512)
    gpu = list(ik.render(ik.placeholder_binary(vendor="nvidia"), opts).argv)
    assert gpu[gpu.index("-ngl") + 1] == "999"
    assert "-ngl" not in ik.render(ik.placeholder_binary(), opts).argv
    for backend, expected in (("cuda", True), ("cpu", False)):
        tag = tmp_path / backend
        (tag / "build" / "bin").mkdir(parents=True)
        (tag / "install.json").write_text(json.dumps({"backend": backend}))
        built = Binary(path=tag / "build" / "bin" / "llama-server", origin="test", env={})
        assert ("-ngl" in ik.render(built, opts).argv) is expected, backend
    own = list(ik.render(ik.placeholder_binary(vendor="nvidia"), LaunchOptions(
        model_path=_model(tmp_path), extra_args=("-ngl", "20"))).argv)
    assert own.count("-ngl") == 1 and own[own.index("-ngl") + 1] == "20"
    recipe = cli("recipe", "qwen3.6-27b", "--engine", "ik_llama.cpp", "--rig", "h200")
    assert recipe.returncode == 0 and " -ngl 999 " in recipe.stdout, recipe.stdout + recipe.stderr


def test_spec_type_is_one_flag_per_stage():
    assert ik.spec_type_args([("ngram-mod", {"n_max": 4, "n_min": 2}), ("mtp", {"n_max": 3, "p_min": 0.0})]) == [
        "--spec-type", "ngram-mod:n_max=4,n_min=2", "--spec-type", "mtp:n_max=3,p_min=0.0"]
    with pytest.raises(BadInput):
        ik.spec_type_args([("mtp:x", {})])


def test_launch_settings_one_shared_buffer_and_no_repack_unless_asked(tmp_path):
    s = ik.launch_settings(LaunchOptions(model_path=_model(tmp_path), ctx=1024, parallel=2))
    assert s == Settled(ctx=1024, parallel=2, kv_unified=True, kv_dtype="f16", repack=False)
    s = ik.launch_settings(LaunchOptions(model_path=_model(tmp_path), extra_args=("-rtr", "-ctk", "q6_0")),
                           trained_ctx=8192)
    assert s.ctx == 8192 and s.parallel == 1 and s.repack is True and s.kv_dtype == "q6_0"


def test_loads_refusal_takes_any_gguf(tmp_path):
    assert ik.loads_refusal(_model(tmp_path)) is None
    (tmp_path / "x.bin").write_bytes(b"PK\3\4")
    assert "is not a GGUF file" in (ik.loads_refusal(tmp_path / "x.bin") or "")
    assert "model folder" in (ik.loads_refusal(tmp_path) or "")


def test_find_binary_never_takes_mainline_on_path(tmp_path, monkeypatch):
    monkeypatch.setenv("ENGINEROOM_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv(ik.ENV_BINARY, raising=False)
    fake = tmp_path / "bin" / "llama-server"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(NotFound, match="engineroom engines install ik_llama.cpp"):
        ik.find_binary()
    monkeypatch.setenv(ik.ENV_BINARY, str(tmp_path / "nope"))
    with pytest.raises(NotFound, match="is not an executable file"):
        ik.find_binary()


def test_the_sdist_lacks_build_info_and_install_writes_it(tmp_path):
    tree = tmp_path / "common"
    tree.mkdir()
    (tree / "build-info.cpp.in").write_text('int LLAMA_BUILD_NUMBER = @BUILD_NUMBER@;\n'
                                            'char const *LLAMA_COMMIT = "@BUILD_COMMIT@";\n')
    out = ik.write_build_info(tmp_path, "0.1.5")
    assert out is not None and "@" not in out.read_text() and "ik-llama-cpp-python-0.1.5" in out.read_text()
    assert "configure_file" in (tmp_path / "common" / "cmake" / "build-info-gen-cpp.cmake").read_text()
    assert ik.write_build_info(tmp_path, "0.1.5") is None      # present: left alone


def test_source_that_is_not_ik_llama_cpp_is_refused(tmp_path):
    (tmp_path / "CMakeLists.txt").write_text("project(x)\n")
    with pytest.raises(BadInput, match="is not an ik_llama.cpp source tree"):
        ik.install(source=tmp_path)


# --------------------------------------------------------------------------- what the real fork said
# ik-llama-cpp-python 0.1.5's files on PyPI (its JSON API, 2026-12-05): the sdist and 16 wheels
RELEASE_WHEELS = [f"ik_llama_cpp_python-0.1.5-cp3{m}-cp3{m}-{plat}.whl" for m in (10, 11, 12, 13)
                  for plat in ("manylinux_2_28_x86_64", "manylinux_2_28_aarch64", "macosx_11_0_arm64", "win_amd64")]


def test_the_wheel_for_this_machine_is_picked_by_its_tags():
    import platform
    import sys

    from engineroom import pypi

    if not (sys.platform.startswith("linux") and platform.machine() == "x86_64"):
        pytest.skip(f"the expected order is written for Linux x86_64; this is {sys.platform} {platform.machine()}")
    order = pypi.fitting_wheels([*RELEASE_WHEELS, "not-a-wheel.tar.gz"])
    ours = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert order and all(name.endswith("manylinux_2_28_x86_64.whl") for name in order), order
    assert len(order) == 4 and order[0] == f"ik_llama_cpp_python-0.1.5-{ours}-{ours}-manylinux_2_28_x86_64.whl"


def test_prebuilt_kernels_are_refused_in_one_sentence_where_they_cannot_apply(tmp_path, monkeypatch):
    from engineroom import cpuprobe
    from engineroom.engines.ikllamacpp import prebuilt

    said = cli("engines", "install", "llama.cpp", "--prebuilt")
    assert said.returncode == 2
    assert "llama.cpp has no prebuilt kernels to build against; drop --prebuilt." in said.stderr
    said = cli("engines", "install", "ik_llama.cpp", "--prebuilt", "--source", str(tmp_path))
    assert said.returncode == 2 and "--prebuilt builds the package's own release" in said.stderr, said.stderr
    said = cli("engines", "install", "ik_llama.cpp", "--prebuilt", "--cuda")
    assert said.returncode == 2 and "builds no CUDA" in said.stderr and "Traceback" not in said.stderr
    with pytest.raises(BadInput, match="builds no CUDA"):
        prebuilt.cmake_options(cuda_arch="90")
    # a CPU without AVX2 is told so before anything is downloaded
    old = cpuprobe.CpuProbe(model="Old Xeon", arch="x86_64", flags=frozenset({"sse4_2", "avx"}))
    monkeypatch.setattr(cpuprobe, "probe_cpu", lambda refresh=False: old)
    monkeypatch.setattr(prebuilt.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(prebuilt.sys, "platform", "linux")
    monkeypatch.setattr(prebuilt, "source_tree", lambda *a, **k: pytest.fail("downloaded before refusing"))
    with pytest.raises(BadInput, match=r"need avx2, f16c, fma, which this CPU \(Old Xeon\) does not run"):
        prebuilt.install_prebuilt()
    monkeypatch.setattr(prebuilt.sys, "platform", "darwin")
    with pytest.raises(BadInput, match="on darwin x86_64 build them here: drop --prebuilt"):
        prebuilt.install_prebuilt()


def test_only_the_wheels_kernels_and_what_they_load_are_copied(tmp_path):
    import zipfile

    from engineroom.engines.ikllamacpp import prebuilt

    wheel = tmp_path / "ik_llama_cpp_python-0.1.5-cp311-cp311-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:      # the layout of the real wheel (auditwheel's *.libs folder)
        for name in ("ik_llama_cpp_python.libs/libggml-0b5e5db1.so",
                     "ik_llama_cpp_python.libs/libgomp-24e2ab19.so.1.0.0",
                     "ik_llama_cpp_python.libs/libllama-43a2e278.so", "ik_llama_cpp/lib/libggml.so",
                     "ik_llama_cpp/_ctypes_api.py"):
            zf.writestr(name, name)
    ggml = prebuilt.kernel_libraries(wheel, tmp_path / "lib")
    assert ggml.name == "libggml-0b5e5db1.so" and ggml.read_text() == "ik_llama_cpp_python.libs/libggml-0b5e5db1.so"
    assert sorted(p.name for p in (tmp_path / "lib").iterdir()) == ["libggml-0b5e5db1.so", "libgomp-24e2ab19.so.1.0.0"]
    bare = tmp_path / "bare.whl"
    with zipfile.ZipFile(bare, "w") as zf:
        zf.writestr("ik_llama_cpp/lib/libggml.so", "x")
    with pytest.raises(NotFound, match="carries no ggml library under"):
        prebuilt.kernel_libraries(bare, tmp_path / "lib2")


def test_help_of_the_real_build_parses_to_its_flags():
    flags = ik.parse_help(_fix("help.txt"))
    for f in ("-np", "--parallel", "-ctk", "--jinja", "--metrics", "-fa", "-khad", "--spec-type",
              "--api-key-file", "-mtp", "--draft-max"):
        assert f in flags, f
    assert "-lv" not in flags and "--kv-unified" not in flags and "-nr" not in flags
    assert "-a" not in flags and "-sm" not in flags     # this help omits flags its parser takes: asked directly


def test_probe_tells_the_fork_from_mainline_by_its_props():
    from engineroom.engines.ikllamacpp.server import _props_are_the_forks

    fork, mainline = json.loads(_fix("props.json")), json.loads(_fix("mainline_props.json"))
    assert _props_are_the_forks(fork) and not _props_are_the_forks(mainline)
    assert "build_info" in mainline and "build_info" not in fork     # what llama.cpp's probe requires
    assert "slots_idle" in json.loads(_fix("health.json"))


def test_metrics_of_the_real_server_normalise():
    m = ik.normalise_metrics(_fix("metrics.txt"))
    assert m["generated_tokens_total"] > 0 and m["prompt_tokens_total"] > 0
    assert 0 <= m["kv_cache_usage_ratio"] <= 1 and m["kv_cache_tokens"] >= 0
    assert not any(k.startswith("spec_") for k in m)              # the fork has no spec-decode counters
    assert ik.normalise_metrics("not prometheus {") == {}


def test_timings_of_a_real_response_normalise():
    raw = json.loads(_fix("timings.json"))
    t = ik.normalise_timings(raw)
    assert t is not None and t.decode_window is DecodeWindow.FIRST_TOKEN_FREE
    assert t.decode_tokens == raw["predicted_n"] and t.cached_tokens is None and t.decode_tps
    assert ik.normalise_timings({}) is None


def test_memory_report_reads_the_real_start_log():
    report = ik.memory_report(_fix("server.log"))
    assert report is not None and report.device == "cpu"
    assert {"weights", "kv_cache", "compute", "output"} <= set(report.names)
    assert report.component("kv_cache") > 0 and report.component("weights") > 50 * 2**20
    assert ik.memory_report("nothing logged") is None


def test_failures_classified_from_real_log_lines():
    assert ik.classify_failure(_fix("bad_flag.log")) == "bad flag"
    assert ik.classify_failure(_fix("bad_model.log")) == "model file could not be loaded"
    assert ik.classify_failure("all fine") == UNKNOWN_FAILURE


# --------------------------------------------------------------------------- integration
@pytest.fixture(scope="session")
def ik_managed(ik_binary, smollm2, tmp_path_factory):
    """`engineroom up smollm2-135m --engine ik_llama.cpp` in a state folder of its own (the
    session's llama.cpp server may run beside it); `engineroom down` at the end."""
    from engineroom.launch import free_port

    env = {"ENGINEROOM_STATE_DIR": str(tmp_path_factory.mktemp("ik-state")), ik.ENV_BINARY: str(ik_binary.path)}
    t0 = time.monotonic()
    proc = cli("up", "smollm2-135m", "--engine", "ik_llama.cpp", "--ctx", "2048", "--parallel", "1",
                   "--threads", "2", "--port", str(free_port()), "--json", env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    state = json.loads(proc.stdout)
    state["_env"], state["_up_seconds"] = env, time.monotonic() - t0
    state["_url"] = f"http://{state['host']}:{state['port']}"
    # the 0.1.5 fork answers the first Jinja-rendered chat after a start with an immediate end of
    # sequence (seen on every start here, -fa on or off, warm-up or not): one request first
    import httpx

    httpx.post(f"{state['_url']}/v1/chat/completions", timeout=60,
               json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    yield state
    cli("down", env=env)


def test_the_install_records_what_it_built(ik_install, ik_binary):
    """`engines install ik_llama.cpp --prebuilt`: the server compiled from the sdist, linked to the ggml of the
    same release's wheel, which it loads from beside the build (no environment needed), and the manifest says
    which kernels and what they need of the CPU."""
    import subprocess

    from engineroom.cpuprobe import probe_cpu
    from engineroom.engines.ikllamacpp import prebuilt

    m = ik_install
    assert m["engine"] == "ik_llama.cpp" and m["origin"]["package"] == ik.SOURCE_PACKAGE
    assert m["origin"]["version"] == ik.SOURCE_VERSION and len(m["origin"]["sha256"]) == 64
    assert m["tag"] == f"v{ik.SOURCE_VERSION}-prebuilt" and m["targets"] == ["llama-server"]
    assert "-DGGML_NATIVE=ON" not in m["cmake_options"] and "-DLLAMA_ALL_WARNINGS=OFF" in m["cmake_options"]
    kernels = m["kernels"]
    assert kernels["from"].startswith(f"ik_llama_cpp_python-{ik.SOURCE_VERSION}-") and kernels["from"].endswith(".whl")
    assert len(kernels["sha256"]) == 64 and kernels["sha256"] != m["origin"]["sha256"]
    lib = Path(m["bin_dir"]).parent.parent / "lib"
    assert [p.name for p in lib.glob("libggml*.so*")] and not list(lib.glob("libllama*"))
    ldd = subprocess.run(["ldd", str(ik_binary.path)], capture_output=True, text=True, timeout=30).stdout
    ggml_line = next(line for line in ldd.splitlines() if "libggml" in line)
    assert str(lib) in str(Path(ggml_line.split("=>")[1].split("(")[0].strip()).resolve()), ldd
    assert "not found" not in ldd, ldd
    assert set(m["built_for_cpu"]["usable_flags"]) <= set(probe_cpu().usable)
    checked = ik.check_binary_cpu(ik_binary, probe_cpu())
    assert checked["how"] == m["built_for_cpu"]["how"] == prebuilt.HOW
    assert Path(m["build_log"]).is_file()
    assert ik.binary_version(ik_binary).startswith(m["tag"])     # v0.1.5-prebuilt [0 (ik-llama-cpp-python-0.1.5)]


def test_validation_refuses_a_misspelt_flag_with_the_nearest(ik_binary, tmp_path):
    opts = LaunchOptions(model_path=_model(tmp_path), extra_args=("--metrix",))
    with pytest.raises(BadInput, match=r"has no flag --metrix; the nearest it has is --metrics"):
        ik.render(ik_binary, opts)
    # mainline-only flags are refused before anything starts
    assert "no flag -lv" in (ik.validate_argv(ik_binary, [str(ik_binary.path), "-lv", "4"]) or "")
    assert "no flag --kv-unified" in (ik.validate_argv(ik_binary, [str(ik_binary.path), "--kv-unified"]) or "")
    # this build still has the legacy speculative flags (newer ik_llama.cpp rejects them)
    assert ik.validate_argv(ik_binary, [str(ik_binary.path), "-mtp", "--draft-max", "4"]) is None
    # the prompt cache's cap is the fork's flag too (engines.llamacpp.host_cache_change)
    assert ik.validate_argv(ik_binary, [str(ik_binary.path), *ik.host_cache_change(1 << 30).args]) is None
    assert engines.adapter("ik_llama.cpp").validate_argv(ik_binary, [str(ik_binary.path), "--metrix"])


def test_up_detects_the_fork_and_records_memory(ik_managed):
    state = ik_managed
    assert state["engine"] == "ik_llama.cpp" and "--jinja" in state["argv"]
    info = engines.detect(state["_url"])
    assert info.engine == "ik_llama.cpp" and info.total_slots == 1
    assert llamacpp.probe(state["_url"]) is None               # mainline's adapter leaves it alone
    rows = {r["component"]: r for r in state["memory"]["rows"]}
    assert rows["kv_cache"]["predicted_bytes"] and rows["kv_cache"]["measured_bytes"]
    assert abs(rows["kv_cache"]["error_pct"]) < 1.0, rows["kv_cache"]
    assert rows["weights"]["measured_bytes"] and abs(rows["weights"]["error_pct"]) < 2.0, rows["weights"]
    # the fork reserves logits for the whole ubatch (catalog graph_outputs: ubatch): fit's compute
    # is within 15% of its buffer (it was -84% before the catalog field; benchmarks/ik_llamacpp_cpu.md)
    assert rows["compute"]["measured_bytes"] and abs(rows["compute"]["error_pct"]) < 15.0, rows["compute"]


def test_verify_passes_on_the_real_fork(ik_managed):
    proc = cli("verify", "--json", env=ik_managed["_env"], timeout=600)
    out = json.loads(proc.stdout)
    checks = {r["name"]: r for r in out["results"]}
    assert out["engine"] == "ik_llama.cpp"
    for name in ("reachable", "basic_answer", "streaming", "json_schema"):
        assert checks[name]["status"] == "PASS", checks[name]
    assert proc.returncode == out["failed"]


def test_bench_stores_the_forks_run(ik_managed):
    proc = cli("bench", "--warmup", "1", "--runs", "2", "--max-tokens", "24", "--json",
                   env=ik_managed["_env"], timeout=600)
    out = json.loads(proc.stdout)
    assert_ok_or_invalid_on_the_machine_alone(proc, out)      # storage is the subject (2 requests of 24 tokens)
    run_id = out["run_id"]
    with sqlite3.connect(paths.db_path()) as db:
        n = db.execute("select count(*) from records where run_id = ? and kind = 'bench_request'",
                       (run_id,)).fetchone()[0]
        snaps = db.execute("select count(*) from records where run_id = ? and kind = 'engine_metrics'",
                           (run_id,)).fetchone()[0]
    assert n == 2 * (1 + 2) and snaps == 2
    card = cli("report", str(run_id), env=ik_managed["_env"], check=True).stdout
    assert "ik_llama.cpp" in card and "smollm2-135m" in card


def test_a_picks_fork_flags_launch_on_the_real_fork_and_it_answers(ik_binary, smollm2, tmp_path):
    """The recipe's own fork flags, launched for real: the max-context pick renders a q4_0 cache with
    the fork's Hadamard transforms (-khad -vhad) and --merge-qkv; the binary accepts them, the server
    comes up placed as planned, and answers a chat; `switch` to the same model keeps them."""
    import httpx

    from engineroom.launch import free_port

    env = {"ENGINEROOM_STATE_DIR": str(tmp_path / "state"), ik.ENV_BINARY: str(ik_binary.path)}
    proc = cli("up", "smollm2-135m", "--engine", "ik_llama.cpp", "--priority", "max-context", "--ctx", "2048",
                   "--parallel", "1", "--threads", "2", "--port", str(free_port()), "--json", env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    try:
        state = json.loads(proc.stdout)
        argv = state["argv"]
        for flag in ("-khad", "-vhad", "--merge-qkv"):
            assert flag in argv, (flag, argv)
        assert argv[argv.index("-ctk") + 1] == "q4_0" and argv[argv.index("-ctv") + 1] == "q4_0"
        assert state["memory"]["placement"]["status"] == "as_planned", state["memory"]["placement"]
        url = f"http://{state['host']}:{state['port']}"
        for _ in range(2):        # the fork's first Jinja-rendered chat after a start may end at once
            reply = httpx.post(f"{url}/v1/chat/completions", timeout=120,
                               json={"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16})
            assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"].strip()
        # a switch to the same model keeps the plan's request (the fork's flags) with the new context
        switched = cli("switch", "smollm2-135m", "--ctx", "1024", "--json", env=env, timeout=300)
        assert switched.returncode == 0, switched.stderr[-2000:]
        argv = json.loads(switched.stdout)["argv"]
        assert all(flag in argv for flag in ("-khad", "-vhad", "--merge-qkv")), argv
        assert argv[argv.index("-ctk") + 1] == "q4_0" and argv[argv.index("-c") + 1] == "1024"
    finally:
        cli("down", env=env)


# --------------------------------------------------------------------------- verify suites on the same start
def _verify(state: dict, *args: str, timeout: float = 900) -> dict:
    proc = cli("verify", *args, "--json", env=state["_env"], timeout=timeout)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert proc.returncode == out["failed"], proc.stderr[-2000:]           # exit code = FAILs
    assert (out["engine"], out["model"]) == ("ik_llama.cpp", "smollm2-135m")
    return out


Expected = tuple[str, str | tuple[str, ...]]


def _unexpected(expected: dict[str, Expected | list[Expected]], results: list[dict]) -> dict:
    """Checks whose status differs from the table or whose reason does not start as it says (an entry
    that is a list: any one of its outcomes, for the fork's behaviour that comes and goes)."""
    got = {r["name"]: (r["status"], r["reason"]) for r in results}

    def fits(name: str, exp: Expected | list[Expected]) -> bool:
        return any(got[name][0] == status and got[name][1].startswith(start)
                   for status, start in (exp if isinstance(exp, list) else [exp]))

    wrong = {n: got.get(n) for n, exp in expected.items() if n not in got or not fits(n, exp)}
    return {**wrong, **{n: got[n] for n in set(got) - set(expected)}}


NO_CALL = "no tool call (finish_reason=stop)"
# What verify --suite full --fast says of SmolLM2-135M (its own ChatML template, --jinja) on the 0.1.5
# fork, and why. The fork's /props has no chat_template_caps, so it declares nothing about tools and the
# tool checks run (mainline llama-server declares supports_tool_calls = false for this template and SKIPs).
IK_FULL = {
    "reachable": ("PASS", "/v1/models lists 'smollm2-135m'"),
    "basic_answer": ("PASS", "answer contains Paris"),
    "streaming": ("PASS", ""),
    "tool_call": ("PASS", 'get_weather({"city": "Paris"})'),          # tool_choice required: the fork's grammar
    "tool_call_streamed": ("PASS", 'get_weather({"city": "Paris"})'),
    "json_schema": ("PASS", "valid against the schema"),
    "stream_protocol": ("PASS", ""),
    # expected FAIL, the model's: under tool_choice auto nothing forces a call, and the model's own template
    # says nothing of tools; it answers with a timestamp
    "tool_call_auto": ("FAIL", NO_CALL),
    "tool_call_in_reasoning": ("FAIL", NO_CALL),
    # expected FAIL, the model's: one call where two cities ask for two
    "parallel_tool_calls": ("FAIL", "1 tool call(s) for two cities"),
    # expected FAIL, the fork's: 0.1.5 does not force a named tool_choice (mainline makes it a grammar and
    # PASSes with the same model); it answers in prose with finish_reason stop
    "tool_choice_named": ("FAIL", NO_CALL),
    "tool_choice_none": ("PASS", "prose, no call"),
    # expected FAIL, the model's: it does not answer from the tool result
    "tool_round_trip": ("FAIL", "the answer does not use the tool result's 17 °C"),
    "reasoning_split": ("SKIP", "the model does not reason: no reasoning field came back and the served chat "
                                "template has no thinking block nor switch"),
    "thinking_off": ("SKIP", "no thinking switch to test"),
    # expected FAIL, the model's: the grammar holds the JSON's shape but the 135M model loops inside the name
    # string ("Ana-123-123-...") until max_tokens 300 cuts it off (the fork then says stop, not length)
    "json_schema_complex": ("FAIL", "200 answer is not JSON (finish_reason=stop)"),
    "usage": ("PASS", "prompt "),
    "stop_sequence": ("PASS", "stopped right before"),
    # expected FAIL, the fork's: 0.1.5 answers finish_reason "stop" when max_tokens ends the answer
    # (completion_tokens == max_tokens); mainline and vLLM say "length"
    "max_tokens_length": ("FAIL", "finish_reason is 'stop' at max_tokens 8 on a long story, not 'length'"),
    "logprobs": ("PASS", "8 tokens with logprobs and 3 alternatives each"),
    "seed_reproducible": ("PASS", "seed 1234 gave the same"),
    "image_input": ("SKIP", "the server does not report vision (declared absent)"),
    # the answer's wording varies from run to run on the fork (CI: 'The capital of France is Paris. I'm happy
    # to help ...', in double quotes); it always opens with the capital
    "responses_api": ("PASS", ("output message: 'The capital of France is Paris",
                               'output message: "The capital of France is Paris')),
    # expected FAIL now and then, the fork's: the first answer to this newly prefilled 926-token prompt can be
    # an immediate end of sequence (1 completion token, empty; 2 of 2 starts on the loaded dev VM); the same
    # request sent again answers, mainline PASSes, and the fresh-clone CI run of 8357196 PASSed it
    "long_prompt": [("FAIL", "200 but an empty answer to a 926-token prompt"),
                    ("PASS", "926 prompt tokens (4,016 chars) of a 2,048-token context answered")],
    "output_quality": ("PASS", ""),
    "spec_decode": ("SKIP", "the engine reports no drafted tokens: no speculative decoding is running"),
}


def test_verify_full_on_the_real_fork_states_every_outcome(ik_managed):
    from engineroom.checks.full import FULL_CHECKS

    assert set(IK_FULL) == {name for name, _ in FULL_CHECKS}
    out = _verify(ik_managed, "--suite", "full", "--fast")
    assert out["suite"] == "full" and not _unexpected(IK_FULL, out["results"]), _unexpected(IK_FULL, out["results"])


IK_CTX = 2048          # the context `up --ctx 2048 --parallel 1` gives the one slot
RECALL = ("recalled every needle up to ", "served every rung; recall missed at ")   # a 135M model's recall
IK_STRESS = {
    "needle_ladder": ("PASS", RECALL),
    "big_tool_return": ("PASS", ""),
    "ide_system_prompt": ("SKIP", "needs >= 4,096 tokens of context; the server has 2,048"),
    "long_decode": ("PASS", "600 tokens decoded without a crash"),
    "context_ceiling": ("PASS", "filled to "),
}


def test_verify_stress_fast_on_the_real_fork_reaches_its_real_context(ik_managed):
    out = _verify(ik_managed, "--suite", "stress", "--fast", timeout=1800)
    r = {x["name"]: x for x in out["results"]}
    wrong = _unexpected(IK_STRESS, out["results"])
    big = r["big_tool_return"]
    if big["status"] == "FAIL" and "(stream still running after 240 s; cut off)" in big["reason"] \
            and (big["details"]["prompt_tokens"] or 0) > 1000:
        # the machine's, not the fork's: the fork decodes ~140 tokens/s on two idle cores (a 200-token answer
        # takes seconds), but on cores shared with other jobs (load ~20) it decoded 151 tokens in 240 s here
        wrong.pop("big_tool_return")
    assert out["suite"] == "stress" and not wrong, wrong
    assert all(not x["details"]["restarts"] for x in r.values())
    ceiling = r["context_ceiling"]["details"]
    # n_ctx is the fork's own /props n_ctx, and the ladder climbs to 0.92 of it
    assert ceiling["n_ctx"] == IK_CTX and ceiling["top_target"] == int(0.92 * IK_CTX)
    curve = ceiling["curve"]
    assert [rung["target_tokens"] for rung in curve] == [512, 1024, 1536, 1884]
    assert all(rung["http"] == 200 and rung["outcome"] in ("pass", "quality ceiling") for rung in curve), curve
    assert ceiling["memory_ceiling_tokens"] >= 0.9 * IK_CTX, ceiling       # the engine served its whole context


def test_quick_soak_on_the_real_fork(ik_managed):
    """`verify --suite soak --fast --turns 10`: two fresh sessions of five turns (the fewest that give a
    memory baseline and a session after it), memory read as the USS of the fork's process."""
    out = _verify(ik_managed, "--suite", "soak", "--fast", "--turns", "10", timeout=1200)
    [res] = out["results"]
    d = res["details"]
    assert d["memory_source"] == "uss", d["memory_description"]
    assert d["memory_description"].startswith(f"unique memory (USS) of the managed engine's process tree (pid "
                                              f"{ik_managed['pid']}")
    assert d["turns"] == 10 and all(isinstance(t["memory"]["bytes"], int) for t in d["turn_records"])
    outcomes = {r["rule"]: r["outcome"] for r in d["rules"]}
    errored = [t for t in d["turn_records"] if t["check"]["status"] == "error"]
    # expected FAIL on errors, now and then, the fork's: under the --fast budget (64 tokens) the model's tool call
    # on turn 2 is cut off mid-argument, the fork hands it back as it is (arguments not JSON), and when the soak
    # sends that call back on turn 3 the fork's template answers HTTP 500 "Failed to parse tool call arguments
    # as JSON" (a request it could refuse with 400, from a call it made itself). The session ends there.
    assert all(t["check"]["reason"].startswith("HTTP 500: Failed to parse tool call arguments as JSON")
               for t in errored), errored
    assert outcomes["errors"] == ("FAIL" if errored else "PASS"), d["rules"]
    assert res["status"] == "FAIL" or not errored, d["rules"]
    # the fork also answers some turns (4 of 10 here) with an immediate end of sequence (1 token, no text,
    # "empty"), as it does on long_prompt in the full suite
    assert outcomes["silent_empty"] in ("PASS", "WARN"), d["rules"]
    # memory stays flat (the baseline: the first error-free session)
    assert outcomes["memory_growth"] in ("PASS", "not judged") and outcomes["memory_oscillation"] in (
        "PASS", "not judged"), d["rules"]
    assert outcomes["quality_drift"] == "not judged" and outcomes["memory_slope"] == "not judged"
    fired = {r["rule"] for r in d["rules"] if r["outcome"] in ("FAIL", "WARN")}
    assert fired <= {"errors", "silent_empty", "slow_turn", "ttft_growth", "decode_drift"}, d["rules"]


def test_toolstream_on_the_real_fork(ik_managed):
    out = _verify(ik_managed, "--suite", "toolstream", "--tries", "2")
    [res] = out["results"]
    # Try 2 (time, tool_choice auto): nothing forces a call and the model answers in prose: a lost call, the
    # model's. Try 1 (weather, tool_choice required): the fork's grammar forces a call; at temperature 0.6 the
    # model sometimes calls get_weather (PASS), sometimes send_email with a looping subject
    # ("..._Lagrange_Lagrange_...") that the budget or, on a loaded machine, the 120 s timeout cuts off (DROP).
    assert res["name"] == "stream_tool_calls" and res["status"] == "FAIL", res["reason"]
    tries = res["details"]["try_records"]
    assert [t["tool_choice"] for t in tries] == ["required", "auto"], tries
    assert tries[0]["tools_called"], tries[0]                     # required: a call always came
    assert (tries[1]["outcome"], tries[1]["how"]) == ("DROP", "lost"), tries[1]
    assert res["reason"].startswith(("0/2 PASS, 2 DROP", "1/2 PASS, 1 DROP")), res["reason"]
