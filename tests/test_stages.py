"""The stage runner (flows.stages): one progress line per stage, one record of what ran with each
stage's outcome, and the served block that stops its server however it ends."""

from __future__ import annotations

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
