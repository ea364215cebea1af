"""The helpers the engine adapters share: engines/argv.py (flags in an argument list), engines/running.py
(health, failure patterns, probes, /metrics), engines/installs.py (manifests, the program the user names)
and build.fetch_source; and each adapter's own reading kept where the engines differ."""

from __future__ import annotations

import json
import os

import httpx
import pytest

from engineroom.engines import argv, build, installs, llamacpp, running, sglang, vllm
from engineroom.engines.base import UNKNOWN_FAILURE, HealthState, LaunchOptions
from engineroom.errors import NotFound


def test_a_flag_is_found_alone_or_with_its_value_after_an_equals_sign():
    args = ["-c", "1", "--ctx=2", "-x", "-c"]
    assert argv.has_flag(args, "--ctx") and argv.has_flag(args, "-y", "-x")
    assert not argv.has_flag(["--ctxx=1"], "--ctx") and not argv.has_flag([], "-c")
    assert argv.flag_value(args, "-c", "--ctx") == "1"                  # the first one given
    assert argv.flag_value(args, "--ctx", "-c", last=True) == "2"       # the last with a value (the last -c has none)
    assert argv.flag_value(args, "-y") is None and argv.flag_value(["-c"], "-c") is None


def test_taking_flags_out_keeps_the_rest_in_order_and_leaves_a_flag_without_its_value():
    rest, taken = argv.take_flags(["--key", "a", "-x", "--file=/k", "--key=b", "-y", "--key"], "--key", "--file")
    assert rest == ["-x", "-y", "--key"] and taken == {"--key": "b", "--file": "/k"}
    assert argv.take_flags([], "--key") == ([], {})


def test_each_adapter_keeps_its_own_reading_of_a_flag_given_twice(tmp_path):
    """vLLM's argparse keeps the last value; llama.cpp's and SGLang's readings take the first, as before."""
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    twice = ("--gpu-memory-utilization", "0.5", "--gpu-memory-utilization=0.7")
    assert vllm.launch_settings(LaunchOptions(model_path=folder, extra_args=twice)).mem_fraction == 0.7
    twice = ("--mem-fraction-static", "0.5", "--mem-fraction-static=0.7")
    assert sglang.launch_settings(LaunchOptions(model_path=folder, extra_args=twice)).mem_fraction == 0.5
    twice = ("-ctk", "q8_0", "--cache-type-k", "q4_0")
    assert llamacpp.launch_settings(LaunchOptions(model_path=tmp_path / "m.gguf", extra_args=twice)).kv_dtype == "q8_0"


def test_a_health_answer_means_what_the_engines_table_says():
    loading_503 = {200: HealthState.READY, 503: HealthState.LOADING}
    assert running.health_from(None, loading_503, silent=HealthState.STARTING) is HealthState.STARTING
    assert running.health_from(503, loading_503, silent=HealthState.STARTING) is HealthState.LOADING
    assert running.health_from(500, loading_503, silent=HealthState.STARTING) is HealthState.ERROR
    assert [vllm.health_state(c) for c in (None, 200, 503)] == ["loading", "ready", "error"]
    assert [sglang.health_state(c) for c in (None, 200, 503)] == ["starting", "ready", "loading"]


def test_the_first_failure_pattern_the_log_matches_names_the_failure():
    patterns = (("out of memory", "oom"), ("error", "something else"))
    assert running.failure_reason("ERROR: CUDA Out Of Memory", patterns) == "oom"
    assert running.failure_reason("error: bad", patterns) == "something else"
    assert running.failure_reason("all fine", patterns) == UNKNOWN_FAILURE


def test_a_probe_sends_the_key_and_reads_the_first_model_id():
    assert running.bearer(None) == {} and running.bearer("k") == {"Authorization": "Bearer k"}
    answers = {"/v1/models": {"data": [{"id": "smol"}, {"id": "other"}]}}

    def handler(request: httpx.Request) -> httpx.Response:
        got = answers.get(request.url.path)
        return httpx.Response(200, json=got) if got is not None else httpx.Response(404)

    with httpx.Client(transport=httpx.MockTransport(handler)) as http:
        assert running.served_model_id(http, "http://x") == "smol"
        answers["/v1/models"] = {"data": []}
        assert running.served_model_id(http, "http://x") == ""
        del answers["/v1/models"]
        assert running.served_model_id(http, "http://x") == ""


def test_prometheus_samples_name_their_family_and_an_unreadable_page_is_none():
    page = '# TYPE h histogram\nh_bucket{le="+Inf"} 1\nh_sum 2.5\nh_count 1\ng 7\n'
    assert running.prometheus_samples(page) == [("h_bucket", "h", 1.0), ("h_sum", "h", 2.5), ("h_count", "h", 1.0),
                                                ("g", "g", 7.0)]
    assert running.prometheus_samples("x{{{ 1") is None and running.prometheus_samples("") == []
    # llama.cpp's reading: one value a name, by sample or family name; vLLM's: summed over label sets
    assert llamacpp.server.metrics_named(page, {"h": "hist", "g": "gauge"}) == {"hist": 1.0, "gauge": 7.0}
    labelled = 'vllm:num_requests_running{engine="0"} 2\nvllm:num_requests_running{engine="1"} 3\n'
    assert vllm.normalise_metrics(labelled) == {"requests_running": 5.0}
    assert llamacpp.normalise_metrics("x{{{ 1") == {} == vllm.normalise_metrics("x{{{ 1")


def test_install_manifests_are_read_newest_first_and_an_unreadable_one_is_left_out(tmp_path):
    for tag, when in (("old", 1_000), ("new", 2_000), ("broken", 3_000)):
        (tmp_path / tag).mkdir()
        path = tmp_path / tag / installs.MANIFEST
        path.write_text("{not json" if tag == "broken" else json.dumps({"tag": tag}))
        os.utime(path, (when, when))
    assert [m["tag"] for m in installs.manifests(tmp_path)] == ["new", "old"]
    assert installs.read_manifest(tmp_path / "new" / installs.MANIFEST) == {"tag": "new"}
    (tmp_path / "list.json").write_text("[1]")
    assert installs.read_manifest(tmp_path / "broken" / installs.MANIFEST) == {}
    assert installs.read_manifest(tmp_path / "list.json") == {} == installs.read_manifest(tmp_path / "none.json")


def test_the_program_the_user_names_comes_from_the_option_then_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv("ENGINEROOM_TEST_BIN", raising=False)
    assert installs.given_program(None, "ENGINEROOM_TEST_BIN", "the server") is None
    program = tmp_path / "server"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    monkeypatch.setenv("ENGINEROOM_TEST_BIN", str(program))
    assert installs.given_program(None, "ENGINEROOM_TEST_BIN", "the server") == (program, "$ENGINEROOM_TEST_BIN")
    assert installs.given_program(str(program), "ENGINEROOM_TEST_BIN", "the server") == (program, "--engine-bin")
    with pytest.raises(NotFound, match=r"the server given by --engine-bin \(.*nope\) is not an executable file"):
        installs.given_program(str(tmp_path / "nope"), "ENGINEROOM_TEST_BIN", "the server")


def test_a_source_folder_is_built_under_a_tag_of_its_path(tmp_path):
    where, origin, tag = build.fetch_source(tmp_path, "some-package", "1.0", sdist_tag="v1.0")
    assert where == tmp_path and origin == {"path": str(tmp_path.resolve())}
    assert tag.startswith("source-") and len(tag) == len("source-") + 8
    with pytest.raises(NotFound, match="does not exist"):
        build.fetch_source(tmp_path / "nope", "some-package", "1.0", sdist_tag="v1.0")
