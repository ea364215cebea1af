"""`engineroom engines` says what each engine went through on this machine, read from the store."""

from __future__ import annotations

from engineroom.flows.history import engine_history
from engineroom.store import Store


def test_history_is_the_newest_run_of_each_kind_per_engine(tmp_path):
    store = Store(tmp_path / "r.sqlite")
    old = store.start_run("verify", {"engine": "llama.cpp"})
    store.finish_run(old, "FAILED", {"PASS": 4, "FAIL": 2, "SKIP": 0})
    new = store.start_run("verify", {"engine": "llama.cpp"})
    store.finish_run(new, "OK", {"PASS": 6, "FAIL": 0, "SKIP": 1})
    bench = store.start_run("bench", {"engine": "vllm"})
    store.finish_run(bench, "OK", {"workloads": {"narrative": {"decode_tps": {"mean": 21.54}},
                                                 "code": {"decode_tps": {"mean": 19.0}}}})
    store.start_run("report", {"engine": "vllm"})            # not a kind the listing shows
    store.start_run("verify", {"url": "http://x"})           # no engine named: left out
    hist = engine_history(store)
    assert set(hist) == {"llama.cpp", "vllm"}
    assert hist["llama.cpp"]["verify"]["run"] == new and hist["llama.cpp"]["verify"]["passed"] == "6/6"
    assert hist["vllm"] == {"bench": {"run": bench, "kind": "bench", "status": "OK",
                                      "when": hist["vllm"]["bench"]["when"], "decode_tps": 21.5}}
    store.close()
