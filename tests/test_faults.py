"""Faults a new user meets (issue 17 items 2, 4, 5; issue 15 item 7): the managed server is never
lost, provenance is checked, keys stay out of the engine's environment, every number is checked.

The unit tests run in-process (typer's CliRunner); the ones that need a process boundary or the
real llama-server (switch to a damaged file, a damaged state file, /proc/PID/environ) start it
through the CLI, as a user would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from engineroom import apikey, engines, launch, models
from engineroom.engines.base import LaunchOptions
from engineroom.errors import BadInput
from engineroom.flows import serving, switching
from engineroom.launchargs import LaunchArgs

from conftest import cli


@pytest.fixture()
def own_state(tmp_path, monkeypatch) -> Path:
    """A state folder of this test's own (the session's managed server lives in another)."""
    state = tmp_path / "state"
    monkeypatch.setenv("ENGINEROOM_STATE_DIR", str(state))
    return state


# --------------------------------------------------------------------------- numbers at the CLI
@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf"])
def test_up_timeout_must_be_a_positive_finite_number(value, own_state):
    done = cli("up", "smollm2-135m", "--timeout", value)
    assert done.returncode == 2 and done.stderr.startswith("error: --timeout must be a positive number of seconds"), \
        done.stderr
    assert launch.read_state() is None           # nothing started


def test_logs_lines_cannot_be_negative(own_state):
    done = cli("logs", "-n", "-5")
    assert done.returncode == 2 and done.stderr == "error: --lines must be 0 or more, not -5.\n", done.stderr


@pytest.mark.parametrize("value", ["0", "-1"])
def test_runs_limit_must_be_at_least_one(value, tmp_path, monkeypatch):
    monkeypatch.setenv("ENGINEROOM_DATA_DIR", str(tmp_path / "data"))
    done = cli("runs", "-n", value)
    assert done.returncode == 2 and done.stderr == f"error: --limit must be at least 1, not {value}.\n", done.stderr


@pytest.mark.parametrize(("args", "sentence"), [
    (("--runs", "0"), "A bench needs at least 1 measured request"),
    (("--warmup", "-1"), "no negative warm-ups"),
    (("--max-tokens", "0"), "max_tokens must be at least 1, not 0."),
    (("--quiet-wait", "-5"), "--quiet-wait must be a number of seconds, 0 or more, not -5.0."),
    (("--quiet-wait", "nan"), "--quiet-wait must be a number of seconds, 0 or more, not nan."),
])
def test_demo_refuses_bad_bench_settings_before_pulling_or_starting_anything(args, sentence, tmp_path, monkeypatch):
    """Checked before the model is pulled or an engine started: no state file, no model file, no run."""
    for var in ("ENGINEROOM_DATA_DIR", "ENGINEROOM_STATE_DIR", "ENGINEROOM_CACHE_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var))
    done = cli("demo", *args)
    assert done.returncode == 2 and sentence in done.stderr, done.stderr
    assert not list((tmp_path / "ENGINEROOM_CACHE_DIR").rglob("*.gguf"))       # nothing pulled
    assert not (tmp_path / "ENGINEROOM_STATE_DIR" / "server.json").exists()   # nothing started
    from engineroom.store import Store

    with Store(tmp_path / "ENGINEROOM_DATA_DIR" / "results.sqlite") as store:
        assert store.runs(10) == []                                          # no run stored


def test_every_bench_suite_is_a_command_and_an_unknown_one_is_refused():
    from engineroom.bench.suites.specs import SUITE_SPECS
    from engineroom.bench.workloads import SUITES

    done = cli("bench", "nosuch")
    assert done.returncode == 2 and "No such command 'nosuch'" in done.stderr
    done = cli("bench", "--help")
    assert done.returncode == 0
    for name in (*SUITES, *SUITE_SPECS):
        assert name in done.stdout, name
    for name in (*[n for n in SUITES if n != "quick"], *SUITE_SPECS):     # quick is `bench` itself
        done = cli("bench", name, "--help")
        assert done.returncode == 0 and f"engineroom bench {name}" in done.stdout, (name, done.stdout[:300])


def test_parallel_beyond_the_engines_limit_is_refused_before_launch(own_state):
    limit = engines.adapter("llama.cpp").max_parallel
    assert limit == 256                              # LLAMA_MAX_SEQ of llama.cpp
    done = cli("up", "smollm2-135m", "--parallel", "3000")
    assert done.returncode == 2, done.stderr
    assert done.stderr == "error: --parallel 3000 is more sequences than llama.cpp serves at once; give at most 256.\n"
    assert launch.read_state() is None


def test_the_engines_own_sequence_refusal_is_classified():
    log = "llama_context: n_seq_max must be <= 256\nllama_init_from_model: failed to initialize the context"
    assert engines.adapter("llama.cpp").classify_failure(log) == \
        "more sequences (--parallel) than llama.cpp serves at once"


# --------------------------------------------------------------------------- bind address
@pytest.mark.parametrize("extra", [("--host", "0.0.0.0"), ("--host=127.0.0.2",), ("--port", "9999")])
def test_extra_arguments_that_move_the_server_are_refused(extra):
    adapter = engines.adapter("llama.cpp")
    spec = adapter.render(adapter.placeholder_binary(None),
                          LaunchOptions(model_path=Path("/m.gguf"), port=8123, extra_args=extra))
    with pytest.raises(BadInput, match=r"after `--` would change where the managed server listens"):
        serving.check_bind_args(spec, extra)
    fine = ("-b", "1024", "--metrics")
    spec = adapter.render(adapter.placeholder_binary(None),
                          LaunchOptions(model_path=Path("/m.gguf"), port=8123, extra_args=fine))
    serving.check_bind_args(spec, fine)           # other engine arguments pass


def test_up_with_a_bind_flag_after_the_double_dash_starts_nothing(llama_server_binary, smollm2, tmp_path):
    """The console command as a user types it: `up smollm2-135m -- --host 0.0.0.0` (which would expose
    the server while `status` said 127.0.0.1) ends in one sentence, exit 2, and no engine process."""
    env = {"ENGINEROOM_STATE_DIR": str(tmp_path / "state")}
    before = {p.pid for p in psutil.process_iter(["name"]) if p.info["name"] == llama_server_binary.path.name}
    proc = cli("up", "smollm2-135m", "--port", "0", "--", "--host", "0.0.0.0", env=env, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "would change where the managed server listens" in proc.stderr and "--docker --host" in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert "Traceback" not in proc.stderr and len(errors) == 1          # one sentence
    after = {p.pid for p in psutil.process_iter(["name"]) if p.info["name"] == llama_server_binary.path.name}
    assert after <= before                                   # nothing was started
    assert not (tmp_path / "state" / "server.json").exists()


# --------------------------------------------------------------------------- switch across engines
def _state(**over) -> launch.ServerState:
    base = dict(pid=os.getpid(), port=8123, host="127.0.0.1", engine="llama.cpp", argv=["llama-server"],
                model="smollm2-135m", model_path="/m.gguf", log_path="/l.log", started_at=0.0,
                args=LaunchArgs(engine="llama.cpp", engine_bin="/opt/llama/llama-server", extra_args=("-b", "1024"),
                                kv_dtype="q4_0", ctx=1024, threads=2))
    base.update(over)
    return launch.ServerState(**base)


def test_switch_to_another_engine_carries_none_of_the_old_engines_own_options():
    typed = LaunchArgs(engine="vllm")
    merged, left = switching.carried_args(typed, ["engine"], _state())
    assert merged.engine == "vllm" and merged.engine_bin is None and merged.extra_args == ()
    assert merged.kv_dtype is None
    assert merged.ctx == 1024 and merged.threads == 2 and merged.port == 8123   # engine-neutral: kept
    assert sorted(left) == ["engine_bin", "extra_args", "kv_dtype"]
    same, left = switching.carried_args(LaunchArgs(), [], _state())   # the same engine keeps them all
    assert same.engine == "llama.cpp" and same.engine_bin == "/opt/llama/llama-server" and not left
    assert same.extra_args == ("-b", "1024")
    # typed this time wins; a state file round-trips the arguments whole
    again, _ = switching.carried_args(LaunchArgs(ctx=4096), ["ctx"], _state())
    assert again.ctx == 4096 and again.threads == 2
    assert LaunchArgs.from_dict(json.loads(json.dumps(same.to_dict()))) == same


# --------------------------------------------------------------------------- model files
def test_a_truncated_gguf_is_refused_whole(smollm2_file, tmp_path):
    data = smollm2_file.read_bytes()
    for cut, why in ((50, "ends inside the header"), (len(data) // 2, "header lists"),
                     (len(data) - 1, "header lists")):
        broken = tmp_path / f"trunc{cut}.gguf"
        broken.write_bytes(data[:cut])
        with pytest.raises(BadInput, match=f"is a truncated GGUF file: .*{why}"):
            models.check_gguf(broken)
        with pytest.raises(BadInput, match="truncated GGUF"):   # what prepare reads: the error is not swallowed
            serving._read_arch(broken)
    models.check_gguf(smollm2_file)


def test_the_served_files_sha256_is_its_own_and_follows_a_change_in_place(tmp_path):
    f = tmp_path / "model.gguf"
    f.write_bytes(b"GGUF" + b"\0" * 1000)
    import hashlib

    first = models.file_sha256(f)
    assert first == hashlib.sha256(f.read_bytes()).hexdigest()
    assert models.file_sha256(f) == first                          # cached (path, size, mtime)
    f.write_bytes(b"GGUF" + b"\1" * 1000)                          # changed in place, same size
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 1_000_000))
    assert models.file_sha256(f) == hashlib.sha256(f.read_bytes()).hexdigest() != first


def test_the_card_states_the_served_files_digest_and_that_it_is_not_the_catalogs(tmp_path, monkeypatch):
    """A packaged model's file changed in place after it was pulled: the run's conditions and the
    card carry the served file's own sha256 and say it is not the catalog's (the conditions are
    taken from the managed server's state, as for a bench of `engineroom up smollm2-135m`)."""
    import hashlib

    from engineroom.engines.base import ServerInfo
    from engineroom.flows.runs import run_conditions
    from engineroom.report import render_card

    monkeypatch.setenv("ENGINEROOM_STATE_DIR", str(tmp_path / "state"))
    served = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    served.write_bytes(b"GGUF" + b"\2" * 4096)                     # not the catalog's bytes
    launch._write_state(launch.ServerState(pid=os.getpid(), port=8123, host="127.0.0.1", engine="llama.cpp",
                                           argv=["llama-server"], model="smollm2-135m", model_path=str(served),
                                           log_path=str(tmp_path / "l.log"), started_at=0.0))
    cond = run_conditions(ServerInfo(url="http://127.0.0.1:8123", engine="llama.cpp"))
    own = hashlib.sha256(served.read_bytes()).hexdigest()
    catalog = models.packaged_models()["smollm2-135m"].sha256
    assert cond["model_sha256"] == own and cond["model_sha256_catalog"] == catalog != own
    card = render_card({"id": 1, "kind": "bench", "status": "OK", "created_at": "", "finished_at": None,
                        "conditions": cond, "summary": {}, "label": ""}, [])
    assert f"sha256 {own[:12]}" in card and f"NOT the catalog's {catalog[:12]}" in card


@pytest.fixture(scope="module")
def smollm2_file(tmp_path_factory) -> Path:
    """A small whole GGUF written with the gguf package (two f32 tensors): only its layout matters here."""
    import numpy as np
    from gguf import GGUFWriter

    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.ones((64, 256), dtype=np.float32))
    writer.add_tensor("output.weight", np.ones((64, 256), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_key_variable_is_hidden_from_the_engine():
    assert apikey.hidden_env(LaunchArgs(api_key_env="MY_KEY")) == ("MY_KEY",)
    assert apikey.hidden_env(LaunchArgs()) == ()


# --------------------------------------------------------------------------- the real llama-server
def _up(*args: str, env: dict | None = None) -> dict:
    proc = cli("up", "smollm2-135m", "--port", "0", "--ctx", "512", "-t", "2", "--parallel", "1", "--json",
               *args, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _state_env(state_dir: Path) -> dict:
    return {"ENGINEROOM_STATE_DIR": str(state_dir)}


def test_switch_to_a_damaged_gguf_keeps_the_old_server_and_a_failed_start_restores_it(
        llama_server_binary, smollm2, tmp_path):
    env = _state_env(tmp_path / "state")
    before = _up(env=env)
    try:
        trunc = tmp_path / "trunc50.gguf"
        trunc.write_bytes(smollm2.read_bytes()[: smollm2.stat().st_size // 2])
        refused = cli("switch", str(trunc), timeout=120, env=env)
        assert refused.returncode == 2 and "is a truncated GGUF file" in refused.stderr, refused.stderr
        st = json.loads(cli("status", "--json", env=env).stdout)
        assert st["running"] and st["state"]["pid"] == before["pid"]          # never stopped

        # a file whose header is whole but which the engine refuses: the old server comes back
        data = bytearray(smollm2.read_bytes())
        key = b"general.architecture"
        at = data.index(key) + len(key) + 4 + 8          # value type (u32), string length (u64)
        assert data[at:at + 5] == b"llama"
        data[at:at + 5] = b"llamx"
        odd = tmp_path / "unknown-arch.gguf"
        odd.write_bytes(bytes(data))
        failed = cli("switch", str(odd), timeout=300, env=env)
        assert failed.returncode == 3, failed.stderr
        assert "the previous server (smollm2-135m) was restarted on port" in failed.stderr, failed.stderr
        assert switching.SWITCH_FAILED_LOG in failed.stderr                    # the failed start's log is kept
        st = json.loads(cli("status", "--json", env=env).stdout)
        assert st["running"] and st["health"] == "ready" and st["state"]["port"] == before["port"]
        assert st["state"]["model_path"] == before["model_path"] and st["state"]["pid"] != before["pid"]
        assert any("restored after a failed switch" in n for n in st["state"]["notes"])
    finally:
        cli("down", env=env)


def test_a_damaged_state_file_is_kept_aside_and_the_server_found_by_its_process(
        llama_server_binary, smollm2, tmp_path):
    state_dir = tmp_path / "state"
    env = _state_env(state_dir)
    server = _up(env=env)
    try:
        (state_dir / launch.STATE_FILE).write_text('{"pid": 12, "port": ')      # cut off mid-write
        st = cli("status", "--json", env=env)
        assert st.returncode == 0, st.stderr
        found = json.loads(st.stdout)
        assert found["running"] and found["state"]["pid"] == server["pid"] and found["state"]["port"] == server["port"]
        assert f"127.0.0.1:{server['port']}" in found["bound"]               # what the engine really bound
        assert any("could not be read; it was kept as" in n for n in found["state"]["notes"])
        kept = list(state_dir.glob(f"{launch.STATE_FILE}{launch.DAMAGED_SUFFIX}*"))
        assert kept and kept[0].read_text() == '{"pid": 12, "port": '       # kept, not deleted
        down = cli("down", "--json", env=env)
        assert down.returncode == 0 and json.loads(down.stdout)["stopped"] is True
        assert not psutil.pid_exists(server["pid"]) or psutil.Process(server["pid"]).status() == psutil.STATUS_ZOMBIE
    finally:
        cli("down", env=env)


def test_a_key_from_the_environment_never_reaches_the_engines_environment(llama_server_binary, smollm2, tmp_path):
    env = {**_state_env(tmp_path / "state"), "H4_TEST_KEY": "k3y-from-the-env-5ecret"}
    server = _up("--api-key-env", "H4_TEST_KEY", env=env)
    try:
        environ = Path(f"/proc/{server['pid']}/environ").read_bytes()
        cmdline = Path(f"/proc/{server['pid']}/cmdline").read_bytes()
        assert b"k3y-from-the-env-5ecret" not in environ and b"H4_TEST_KEY" not in environ
        assert b"k3y-from-the-env-5ecret" not in cmdline
        # the engine still wants the key: it reads it from its 0600 file
        import httpx

        url = f"http://127.0.0.1:{server['port']}/v1/models"
        assert httpx.get(url, timeout=10, trust_env=False).status_code == 401
        ok = httpx.get(url, timeout=10, trust_env=False, headers={"Authorization": "Bearer k3y-from-the-env-5ecret"})
        assert ok.status_code == 200
    finally:
        cli("down", env=env)


def test_no_traceback_for_bad_numbers_through_the_console_command(tmp_path):
    """The process boundary: what a user's shell sees for `logs -n -5` (a traceback before)."""
    proc = subprocess.run([sys.executable, "-m", "engineroom.cli", "logs", "-n", "-5"], capture_output=True,
                          text=True, env={**os.environ, "ENGINEROOM_STATE_DIR": str(tmp_path / "s")}, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--lines must be 0 or more, not -5." in proc.stderr


def test_a_switch_to_the_same_model_keeps_the_plans_request():
    """`up smollm2-135m --engine ik_llama.cpp --priority max-context` then `switch smollm2-135m --ctx 1024`:
    the switch launches the plan's request again (its q4_0 cache and the fork's -khad -vhad --merge-qkv)
    with the new context; another model, another engine or an unplanned launch keep nothing."""
    from engineroom.flows.picks import pick_from_plan

    picked = pick_from_plan("smollm2-135m", priority="max-context", engine="ik_llama.cpp")
    assert picked.request.engine_options and picked.request.kv_dtype == "q4_0"
    row = {k: v for k, v in picked.plan.items() if k not in ("reasons", "tradeoffs")}   # as record_launch keeps it
    current = _state(engine="ik_llama.cpp", memory={"plan": {"source": picked.source, "row": row, "notes": []}})
    kept = switching.kept_pick(current, "smollm2-135m", LaunchArgs(ctx=1024), ["ctx"])
    assert kept is not None and kept.request == picked.request and "kept by switch" in kept.source
    from engineroom.flows.picks import typed_request

    request = typed_request("smollm2-135m", kept, LaunchArgs(ctx=1024), "llama.cpp")
    assert request.ctx == 1024 and request.engine_options == picked.request.engine_options
    assert request.kv_dtype == "q4_0"
    assert switching.kept_pick(current, "gemma-3-270m-pt", LaunchArgs(), []) is None                 # another model
    assert switching.kept_pick(current, "smollm2-135m", LaunchArgs(engine="vllm"), ["engine"]) is None  # another
    assert switching.kept_pick(current, "smollm2-135m", LaunchArgs(engine="ik_llama"), ["engine"]) is not None  # alias
    assert switching.kept_pick(_state(engine="ik_llama.cpp"), "smollm2-135m", LaunchArgs(), []) is None   # not planned


def test_switch_checks_each_gpus_free_memory_counting_what_the_running_server_frees(monkeypatch):
    """On a GPU machine the memory check is per GPU (NVML): free memory plus the running server's own
    use of that GPU; a launch fit puts beyond it is refused before anything stops. (NVML's readings
    are stood in for: this machine has no GPU; the arithmetic and the refusal are what is tested.)"""
    from engineroom import resources
    from engineroom.engines.base import LaunchSpec
    from engineroom.flows.prediction import Prediction
    from engineroom.flows.prepared import Prepared

    gib = 1 << 30
    readings = [{"index": 0, "name": "H200", "used_bytes": 100 * gib, "total_bytes": 140 * gib, "util_pct": 0},
                {"index": 1, "name": "H200", "used_bytes": 2 * gib, "total_bytes": 140 * gib, "util_pct": 0}]
    monkeypatch.setattr(resources, "gpu_memory", lambda: readings)
    monkeypatch.setattr(resources, "gpu_memory_of", lambda pids: {0: 90 * gib} if os.getpid() in pids else {})

    def prepared(**gpus: float) -> Prepared:
        parts = {name: int(v * gib) for name, v in gpus.items()}
        return Prepared(spec=LaunchSpec(engine="llama.cpp", argv=("llama-server",), port=1, model="m"),
                        args=LaunchArgs(), prediction=Prediction({**parts, "total": sum(parts.values())}, {}, "1xH200"))

    running = _state(pid=os.getpid())       # this process plays the running server: 90 GiB of GPU0 is its own
    switching.check_memory(prepared(GPU0=120.0, GPU1=100.0), running)      # 40 + 90 free on GPU0
    with pytest.raises(BadInput, match=r"needs about 135\.00 GiB on GPU0 .* 130\.00 GiB of it would be free"):
        switching.check_memory(prepared(GPU0=135.0), running)
    with pytest.raises(BadInput, match=r"on GPU0 .* 40\.00 GiB of it would be free"):
        switching.check_memory(prepared(GPU0=60.0), None)                    # nothing running frees GPU0
    with pytest.raises(BadInput, match=r"on GPU1"):
        switching.check_memory(prepared(GPU0=1.0, GPU1=139.0), running)
    monkeypatch.setattr(resources, "gpu_memory", lambda: None)               # no NVML: left to the engine
    switching.check_memory(prepared(GPU0=500.0), running)


def test_a_model_file_changed_in_place_is_carded_with_its_new_digest(llama_server_binary, smollm2, tmp_path):
    """The real llama-server serving a copy of SmolLM2: bench's card names the served file's own sha256;
    after one byte of its tensor data changes in place (same size, new mtime) and the server is started
    again, the next card names the new digest, not the one computed before (nor the catalog's)."""
    import hashlib

    served = tmp_path / "model" / smollm2.name
    served.parent.mkdir()
    served.write_bytes(smollm2.read_bytes())
    env = {"ENGINEROOM_STATE_DIR": str(tmp_path / "state"), "ENGINEROOM_DATA_DIR": str(tmp_path / "data")}

    def card_digest() -> str:
        up = cli("up", str(served), "--ctx", "1024", "--parallel", "1", "-t", "2", "--port", "0", "--json",
                 env=env, timeout=300)
        assert up.returncode == 0, up.stderr[-2000:]
        try:
            bench = cli("bench", "--busy-ok", "--warmup", "0", "--runs", "1", "--max-tokens", "8", "--json",
                        env=env, timeout=300)
            assert bench.stdout.strip(), bench.stderr[-2000:]
            card = cli("report", str(json.loads(bench.stdout)["run_id"]), env=env, check=True).stdout
        finally:
            cli("down", env=env)
        line = next(ln for ln in card.splitlines() if ln.startswith("| Model |"))
        return line.split("sha256 ")[1][:12]

    first = card_digest()
    assert first == hashlib.sha256(served.read_bytes()).hexdigest()[:12]
    data = bytearray(served.read_bytes())
    data[-4096] ^= 0x01                                   # one bit of the last tensor's data
    served.write_bytes(bytes(data))
    os.utime(served, ns=(served.stat().st_atime_ns, served.stat().st_mtime_ns + 1_000_000))
    second = card_digest()
    assert second == hashlib.sha256(served.read_bytes()).hexdigest()[:12] != first
