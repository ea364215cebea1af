"""A machine whose CPU lies: the probe's decision, the relaunch after a crash, and how failures read.

Everything here runs the REAL llama-server with SmolLM2. Where the CPU really traps AMX
(some VMs) the probe finds it; on every other machine the same path is exercised by
forcing the probe's answer (ENGINEROOM_CPU_PROBE_FORCE) or by sending the real server the
signal a trap would (SIGILL) while it loads.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from engineroom import cpuprobe, flows, launch
from engineroom.engines import llamacpp
from engineroom.errors import EngineFailed, NotFound
from engineroom.launchargs import LaunchArgs

from conftest import cli

SIGILL_SENTENCE = "crashed: SIGILL, illegal instruction — usually a CPU feature the binary uses but this machine lacks"


@pytest.fixture(autouse=True)
def own_state_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("ENGINEROOM_STATE_DIR", str(tmp_path_factory.mktemp("fallback-state")))
    # the paths below start from a probe that says AMX runs (a machine whose real AMX trap an earlier launch
    # taught the probe would launch with -nr from the start, and never take them); a forced answer is never
    # remembered over (cpuprobe.remember_trap), so the session's cache keeps what this machine really does
    monkeypatch.setenv(cpuprobe.FORCE_ENV, "amx=ok")
    yield
    launch.down()


def _kill_at_warmup(log_of, times: int = 1, sig: int = signal.SIGILL):
    """on_spawn hook: send ``sig`` to the first ``times`` servers once their log shows loading/warm-up."""
    killed: list[int] = []

    def on_spawn(pid: int) -> None:
        if len(killed) >= times:
            return

        def watch() -> None:
            # the warm-up run is where a trapped AMX kernel dies; fall back to "loading" if the
            # log never says it (the process is killed before `up` returns either way)
            deadline, loading_since = time.time() + 60, None
            while time.time() < deadline:
                text = Path(log_of()).read_text(errors="replace") if Path(log_of()).is_file() else ""
                if "warming up" in text:
                    break
                if loading_since is None and "load_tensors" in text:
                    loading_since = time.time()
                if loading_since is not None and time.time() - loading_since > 5:
                    break
                time.sleep(0.005)
            try:
                os.kill(pid, sig)
                killed.append(pid)
            except ProcessLookupError:
                pass

        t = threading.Thread(target=watch, daemon=True)
        t.start()
        t.join(70)

    return on_spawn, killed


def test_forced_amx_trap_launches_without_repack_and_the_card_says_why(llama_server_binary, smollm2, monkeypatch):
    from engineroom.report import render_card
    from engineroom.store import Store

    monkeypatch.setenv(cpuprobe.FORCE_ENV, "amx=trap")
    state = flows.start("smollm2-135m", LaunchArgs(port=0, ctx=1024, threads=2))
    assert state.argv.count("-nr") == 1
    (probe,) = [c for c in state.changes if c["source"] == "cpu probe"]   # (a small machine adds --cache-ram)
    assert probe == {"args": ["-nr"], "why": probe["why"], "source": "cpu probe"}
    assert "AMX does not run on this machine" in probe["why"]
    assert "forced by ENGINEROOM_CPU_PROBE_FORCE" in probe["why"]
    assert "CPU_REPACK" not in Path(state.log_path).read_text(errors="replace")   # the engine really did not repack
    info = flows.connect(state.url)
    with Store() as store:
        outcome = flows.verify(info, store)
        card = render_card(store.get_run(outcome.run_id), store.records(outcome.run_id))
    assert "Changed by engineroom" in card and "added `-nr` (cpu probe)" in card
    assert "amx trap: forced (forced)" in card


def test_the_probe_changes_nothing_where_amx_runs_or_is_absent(llama_server_binary, smollm2):
    probe = cpuprobe.probe_cpu()
    if "amx" in probe.traps:
        pytest.skip("this machine really traps AMX: the forced test above is the real case here")
    assert llamacpp.cpu_adjustments(probe) == []
    trapping = replace(probe, results={**probe.results, "amx": "trap: SIGILL"})
    assert llamacpp.cpu_adjustments(trapping)[0].args == ("-nr",)
    # the user's own -nr (or LLAMA_ARG_REPACK=0) needs no change
    assert llamacpp.cpu_adjustments(replace(probe, results={**probe.results, "amx": "trap: SIGILL"}), ["-nr"]) == []


def test_sigill_at_warmup_relaunches_without_repack(llama_server_binary, smollm2):
    on_spawn, killed = _kill_at_warmup(lambda: launch.last_log())
    state = flows.start("smollm2-135m", LaunchArgs(port=0, ctx=1024, threads=2), on_spawn=on_spawn)
    assert len(killed) == 1 and state.pid != killed[0]
    assert "-nr" in state.argv
    change = state.changes[-1]
    assert change["source"] == "relaunch after a crash" and "SIGILL" in change["why"]
    assert launch.status().health == "ready"


def test_a_second_crash_ends_in_one_sentence_naming_the_signal(llama_server_binary, smollm2):
    on_spawn, killed = _kill_at_warmup(lambda: launch.last_log(), times=2)
    with pytest.raises(EngineFailed) as info:
        flows.start("smollm2-135m", LaunchArgs(port=0, ctx=1024, threads=2), on_spawn=on_spawn)
    assert len(killed) == 2
    message = str(info.value)
    assert SIGILL_SENTENCE in message and "code -4" not in message
    assert "the relaunch with -nr failed too" in message
    assert info.value.detail            # the log lines the sentence points at
    assert launch.read_state() is None and not any(launch.is_alive(p) for p in killed)


def test_describe_exit_names_signals_and_codes():
    assert launch.describe_exit(1) == "exited with code 1"
    assert launch.describe_exit(-signal.SIGILL) == SIGILL_SENTENCE
    assert launch.describe_exit(-signal.SIGSEGV).startswith("crashed: SIGSEGV, segmentation fault")
    assert launch.describe_exit(-signal.SIGKILL).startswith("crashed: SIGKILL, killed")
    assert launch.describe_exit(-99) == "crashed: signal 99"


def test_failed_start_prints_log_lines_first_and_logs_still_shows_them(llama_server_binary, smollm2, tmp_path):
    import gguf

    broken = tmp_path / "unknown-arch.gguf"     # a well-formed GGUF of an architecture llama.cpp does not know
    writer = gguf.GGUFWriter(str(broken), "no-such-arch")
    writer.add_context_length(2048)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    proc = cli("up", str(broken), "--port", "0", timeout=120)
    assert proc.returncode != 0
    err = proc.stderr.strip().splitlines()
    assert err[-1].startswith("error: llama.cpp exited with code 1 while loading (unsupported model)"), proc.stderr
    assert "the last log lines are above" in err[-1]
    assert len(err) > 1 and "Traceback" not in proc.stderr
    logs = cli("logs", "--json")
    assert logs.returncode == 0, logs.stderr
    body = json.loads(logs.stdout)
    assert body["running"] is False and body["lines"]
    assert any("no-such-arch" in line for line in body["lines"])
    assert any("no-such-arch" in line for line in err[:-1])    # the same lines came before the sentence


def test_a_binary_built_for_another_cpu_is_refused_before_launch(llama_server_binary):
    probe = cpuprobe.probe_cpu()
    compiled, how = llamacpp.compiled_cpu_features(llama_server_binary)
    if not compiled:
        pytest.skip(f"this llama-server does not tell what it was compiled for: {how}")
    assert llamacpp.check_binary_cpu(llama_server_binary, probe)["compiled_features"] == sorted(compiled)
    # the same binary on a machine that lacks one of the instruction sets it was compiled for
    lacking = sorted(compiled)[-1]
    other = replace(probe, flags=frozenset(probe.flags - {lacking}))
    with pytest.raises(NotFound) as info:
        llamacpp.check_binary_cpu(llama_server_binary, other)
    assert lacking in str(info.value) and "engineroom engines install llama.cpp" in str(info.value)


@pytest.mark.parametrize("args, says", [
    (["--port", "99999"], "--port must be between 1 and 65535 (0 picks a free port); got 99999."),
    (["--port", "-1"], "--port must be between 1 and 65535 (0 picks a free port); got -1."),
    (["--ctx", "-1"], "--ctx must be a positive number of tokens; got -1."),
    (["--ctx", "100000"], "maximum of 8,192 positions"),
])
def test_bad_launch_values_get_one_sentence(llama_server_binary, smollm2, args, says):
    proc = cli("up", "smollm2-135m", *args, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr and "Traceback" not in proc.stderr
    assert launch.read_state() is None


def test_ctx_above_the_maximum_is_allowed_with_rope_scaling(llama_server_binary, smollm2):
    from engineroom.arch import arch_from_gguf

    arch = arch_from_gguf(smollm2)
    flows.check_ctx(16384, arch, ["--rope-scaling", "yarn", "--rope-scale", "2"], llamacpp)
    with pytest.raises(Exception, match="maximum of 8,192 positions") as info:
        flows.check_ctx(16384, arch, [], llamacpp)
    assert "`-- --rope-scaling yarn --rope-scale 2`" in str(info.value)


def test_port_zero_picks_a_free_port_and_says_which(llama_server_binary, smollm2):
    proc = cli("up", "smollm2-135m", "--port", "0", "--ctx", "1024", "-t", "2", timeout=300)
    assert proc.returncode == 0, proc.stderr
    state = launch.read_state()
    assert state is not None and state.port not in (0, 8080)
    assert f"picked free port {state.port}" in proc.stdout


def test_switch_checks_first_and_keeps_what_was_given(llama_server_binary, smollm2):
    up = cli("up", "smollm2-135m", "--port", "0", "--ctx", "1024", "-t", "2", "--", "-b", "1024", timeout=300)
    assert up.returncode == 0, up.stderr
    before = launch.read_state()
    bad = cli("switch", "no-such-model.gguf", timeout=120)
    assert bad.returncode != 0 and "does not exist" in bad.stderr
    after = launch.read_state()
    assert after is not None and after.pid == before.pid and launch.is_alive(after.pid)   # still serving
    ok = cli("switch", "smollm2-135m", "--ctx", "2048", "--json", timeout=300)
    assert ok.returncode == 0, ok.stderr
    state = json.loads(ok.stdout)
    argv = state["argv"]
    assert argv[argv.index("-b") + 1] == "1024"            # the extra engine args were kept
    # what was given this time won: 2048 tokens for each of the default slots
    assert argv[argv.index("-c") + 1] == str(2048 * llamacpp.launch_defaults()[0])
    assert argv[argv.index("-t") + 1] == "2" and state["port"] == before.port


def test_explicit_slots_are_always_on_the_command_line(llama_server_binary, smollm2, tmp_path):
    from engineroom.engines.base import LaunchOptions

    default = llamacpp.render(llama_server_binary, LaunchOptions(model_path=smollm2, port=1))
    i = default.argv.index("-np")
    assert default.argv[i + 1] == str(llamacpp.launch_defaults()[0]) and "--kv-unified" in default.argv
    two = llamacpp.render(llama_server_binary, LaunchOptions(model_path=smollm2, port=1, parallel=2, ctx=1000))
    assert two.argv[two.argv.index("-np") + 1] == "2" and "--no-kv-unified" in two.argv
    assert two.argv[two.argv.index("-c") + 1] == "2000"      # -c holds ctx tokens for each slot
    mine = llamacpp.render(llama_server_binary, LaunchOptions(model_path=smollm2, port=1,
                                                              extra_args=("-np", "3", "-kvu")))
    assert mine.argv.count("-np") == 1 and "--no-kv-unified" not in mine.argv
