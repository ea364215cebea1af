"""The stage runner (flows.stages): one progress line per stage, one record of what ran with each
stage's outcome, and the served block that stops its server however it ends."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from engineroom.flows import stages
from engineroom.flows.stages import StageLog


def test_each_stage_is_said_and_recorded_with_its_outcome():
    said: list[str] = []
    log = StageLog(said.append)
    with log.stage("plan", "plan m for this machine"):
        pass
    with log.stage("pull", ""):                  # a stage that reports its own progress says nothing more
        pass
    with pytest.raises(ValueError), log.stage("bench"):
        raise ValueError("no answer")
    with pytest.raises(KeyboardInterrupt), log.stage("verify"):
        raise KeyboardInterrupt
    assert said == ["plan m for this machine", "bench", "verify"]
    assert [(e["stage"], e["outcome"]) for e in log.so_far()] == [
        ("plan", "done"), ("pull", "done"), ("bench", "failed: ValueError: no answer"), ("verify", "interrupted")]
    assert all(e["seconds"] >= 0 for e in log.entries)


@pytest.mark.parametrize("ending", [None, RuntimeError, KeyboardInterrupt])
def test_served_stops_the_server_however_the_block_ends_unless_kept(monkeypatch, ending):
    """The launch and the engine are this test's stand-ins: the subject is the block's exit rule."""
    calls: list[str] = []

    class State:
        url = "http://127.0.0.1:1"

    monkeypatch.setattr(stages, "start", lambda *a, **k: calls.append("start") or State())
    monkeypatch.setattr(stages, "stop", lambda: calls.append("stop"))
    monkeypatch.setattr(stages, "client_key", lambda url: None)
    monkeypatch.setattr(stages, "connect", lambda url, api_key=None: calls.append("connect") or "info")
    for keep in (False, True):
        calls.clear()
        log = StageLog()
        try:
            with stages.served("m", None, log, keep=keep) as s:      # type: ignore[arg-type]
                assert s.info == "info"
                if ending is not None:
                    raise ending()
        except (RuntimeError, KeyboardInterrupt):
            pass
        assert calls == ["start", "connect"] + ([] if keep else ["stop"])
        assert [e["stage"] for e in log.entries] == ["launch"] + ([] if keep else ["down"])


# --------------------------------------------------------------------------- up and switch on the runner
def _launched(model: str, **over):
    """A stand-in for a launch that came up: its state, and its stored launch run (as ``record_launch``
    writes it)."""
    from engineroom import launch
    from engineroom.store import Store

    with Store() as store:
        run_id = store.start_run("launch", {"model": model}, label=f"up {model}")
        store.finish_run(run_id, "OK", {"placement": "as_planned"})
    base = dict(pid=1, port=8123, host="127.0.0.1", engine="llama.cpp", argv=["llama-server"], model=model,
                model_path="/m.gguf", log_path="/l.log", started_at=0.0, ready_at=0.5, launch_run_id=run_id)
    return launch.ServerState(**{**base, **over})


def _stored_stages(run_id: int) -> list[tuple[str, str]]:
    from engineroom.store import Store

    with Store() as store:
        run = store.get_run(run_id)
    assert run["summary"]["placement"] == "as_planned"          # record_launch's summary kept, stages added
    return [(s["stage"], s["outcome"]) for s in run["summary"][stages.STAGES_KEY]]


@pytest.fixture()
def own_home(tmp_path, monkeypatch):
    monkeypatch.setenv("ENGINEROOM_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("ENGINEROOM_STATE_DIR", str(tmp_path / "state"))
    return tmp_path


@pytest.mark.parametrize("planned", [True, False])
def test_up_runs_on_the_stage_runner_plan_then_launch_recorded_with_its_launch(monkeypatch, own_home, planned):
    """`up MODEL --priority P`: the plan stage, then the launch stage, both in the launch's stored run; the
    launch gets the plan's own request. (The launch is a stand-in: the subject is the composition.)"""
    import json

    from engineroom import flows

    from conftest import cli

    got: dict = {}

    def start(model, args, **kw):
        got.update(kw, model=model)
        return _launched(model)

    monkeypatch.setattr(stages, "start", start)
    extra = ["--priority", "balanced", "--engine", "llama.cpp"] if planned else []
    done = cli("up", "smollm2-135m", "--json", *extra)
    assert done.returncode == 0, done.stderr
    state = json.loads(done.stdout)
    assert _stored_stages(state["launch_run_id"]) == ([("plan", "done")] if planned else []) + [("launch", "done")]
    if planned:
        plan = flows.pick_from_plan("smollm2-135m", priority="balanced", engine="llama.cpp")
        assert got["pick"].request == plan.request and got["pick"].source == plan.source
    else:
        assert got["pick"] is None


def _switch_stand_ins(monkeypatch, *, running: bool, launch_fails: bool = False, memory_refused: bool = False):
    """switch's launch, check and stop stood in for; what ran is in ``calls``."""
    from engineroom import launch
    from engineroom.engines.base import LaunchSpec
    from engineroom.errors import BadInput, EngineFailed
    from engineroom.flows import switching

    calls: list[str] = []
    old = _launched("old-model") if running else None
    prepared = SimpleNamespace(key=None, prediction=None, spec=LaunchSpec(
        engine="llama.cpp", argv=("llama-server",), port=8123, host="127.0.0.1", env={},
        log_path=Path("/nonexistent/server.log"), model="new-model", model_path="/n.gguf"))

    def check_memory(prepared, current):
        calls.append("check_memory")
        if memory_refused:
            raise BadInput("needs more memory than is free")

    def launch_prepared(prepared, **kw):
        calls.append("launch")
        if launch_fails:
            raise EngineFailed("the engine exited")
        return _launched("new-model")

    monkeypatch.setattr(launch, "read_state", lambda: old)
    monkeypatch.setattr(launch, "is_alive", lambda pid, created: True)
    monkeypatch.setattr(switching, "prepare", lambda *a, **k: calls.append("prepare") or prepared)
    monkeypatch.setattr(switching, "require", lambda p: calls.append("require"))
    monkeypatch.setattr(switching, "check_memory", check_memory)
    monkeypatch.setattr(switching, "stop", lambda: calls.append("stop"))
    monkeypatch.setattr(switching, "launch_prepared", launch_prepared)
    monkeypatch.setattr(switching, "record_launch", lambda state, prepared: calls.append("record") or state)
    monkeypatch.setattr(switching, "restore", lambda old, exc, on_wait: calls.append("restore")
                        or EngineFailed(f"{exc}; the previous server was restarted"))
    return calls


def test_switch_runs_on_the_stage_runner_check_down_launch_recorded_with_its_launch(monkeypatch, own_home):
    from engineroom.flows import switching

    calls = _switch_stand_ins(monkeypatch, running=True)
    log = StageLog()
    state = switching.switch("new-model", log=log)
    assert calls == ["prepare", "require", "check_memory", "stop", "launch", "record"]
    assert [e["stage"] for e in log.entries] == ["check", "down", "launch"]
    assert _stored_stages(state.launch_run_id) == [("check", "done"), ("down", "done"), ("launch", "done")]


def test_a_switch_refused_by_its_check_stops_nothing_and_a_failed_launch_restores(monkeypatch, own_home):
    from engineroom.errors import BadInput, EngineFailed
    from engineroom.flows import switching

    calls = _switch_stand_ins(monkeypatch, running=True, memory_refused=True)
    log = StageLog()
    with pytest.raises(BadInput, match="more memory"):
        switching.switch("new-model", log=log)
    assert "stop" not in calls
    assert [(e["stage"], e["outcome"]) for e in log.entries] == [
        ("check", "failed: BadInput: needs more memory than is free")]

    calls = _switch_stand_ins(monkeypatch, running=True, launch_fails=True)
    log = StageLog()
    with pytest.raises(EngineFailed, match="the previous server was restarted"):
        switching.switch("new-model", log=log)
    assert calls[-2:] == ["launch", "restore"]
    assert [(e["stage"], e["outcome"]) for e in log.entries] == [
        ("check", "done"), ("down", "done"), ("launch", "failed: EngineFailed: the engine exited"),
        ("restore", "done")]

    calls = _switch_stand_ins(monkeypatch, running=False, launch_fails=True)   # nothing ran: nothing to restore
    log = StageLog()
    with pytest.raises(EngineFailed, match="the engine exited"):
        switching.switch("new-model", log=log)
    assert "restore" not in calls and [e["stage"] for e in log.entries] == ["check", "down", "launch"]
