"""API keys by reference, and secrets kept out of everything engineroom stores or prints.

The server tests launch the real llama-server with a key and then look for the key's bytes
everywhere it must not be: the engine's /proc/PID/cmdline, the state file, the SQLite files,
`status --json`, `runs --json`, the card and the server log. Each test uses its own state and
data folders, apart from the session's managed server.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from pathlib import Path

import httpx
import pytest

from engineroom import apikey
from engineroom.engines import llamacpp
from engineroom.errors import BadInput
from engineroom.redaction import MASK, redact, redact_argv, redact_data

from conftest import cli


def _key() -> str:
    """A fresh key per test: nothing can contain it by chance."""
    return "er-test-" + secrets.token_hex(16)


# --------------------------------------------------------------------------- redaction (no server)
def test_redact_argv_masks_the_value_after_a_secret_flag_and_keeps_paths():
    argv = ["llama-server", "-m", "/m.gguf", "--api-key", "k-one", "--api-key=k-two", "-hft", "hf-three",
            "--api-key-file", "/keys/f", "--port", "8080"]
    out = redact_argv(argv)
    assert out == ["llama-server", "-m", "/m.gguf", "--api-key", MASK, f"--api-key={MASK}", "-hft", MASK,
                   "--api-key-file", "/keys/f", "--port", "8080"]


def test_redact_data_masks_secret_keys_and_nested_argv_but_not_references():
    data = {"argv": ["x", "--api-key", "k-one"],
            "args": {"api_key": "k-two", "api_key_env": "MY_VAR", "api_key_file": "/keys/f",
                     "extra_args": ["--hf-token", "k-three"]},
            "env": {"LLAMA_API_KEY": "k-four", "LD_LIBRARY_PATH": "/lib"},
            "url": "http://user:k-five@host:8080/v1", "n_ctx": 4096, "max_tokens": 256}
    out = redact_data(data)
    text = json.dumps(out)
    for leaked in ("k-one", "k-two", "k-three", "k-four", "k-five"):
        assert leaked not in text
    assert out["args"]["api_key_env"] == "MY_VAR" and out["args"]["api_key_file"] == "/keys/f"
    assert out["env"]["LD_LIBRARY_PATH"] == "/lib" and out["n_ctx"] == 4096 and out["max_tokens"] == 256
    assert out["url"] == f"http://user:{MASK}@host:8080/v1"


def test_redact_for_cards_still_masks_flags_in_text():
    assert "k-one" not in redact("llama-server --api-key k-one --api-key-file /srv/keys/f")
    assert "/srv/keys/f" in redact("llama-server --api-key k-one --api-key-file /srv/keys/f")


# --------------------------------------------------------------------------- key references (no server)
@pytest.fixture
def own_dirs(tmp_path, monkeypatch):
    """State and results of this test alone (the session's managed server keeps its own)."""
    monkeypatch.setenv("ENGINEROOM_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("ENGINEROOM_DATA_DIR", str(tmp_path / "data"))
    return tmp_path


def test_a_key_file_open_to_others_is_refused_with_the_chmod_to_run(own_dirs):
    path = own_dirs / "key"
    path.write_text(_key() + "\n")
    for mode in (0o640, 0o604, 0o660):
        path.chmod(mode)
        with pytest.raises(BadInput, match=r"run `chmod 600 .*key`") as err:
            apikey.check_private(path)
        assert "\n" not in str(err.value)
    path.chmod(0o600)
    assert apikey.check_private(path) == path.resolve()


def test_an_api_key_is_written_to_a_private_file_and_only_its_path_is_kept(own_dirs):
    key = _key()
    launch_key = apikey.for_launch(api_key=key)
    assert launch_key.file is not None and launch_key.file.read_text().strip() == key
    assert stat.S_IMODE(launch_key.file.stat().st_mode) == 0o600
    assert stat.S_IMODE(launch_key.file.parent.stat().st_mode) == 0o700
    assert (launch_key.env, launch_key.file_ref) == (None, str(launch_key.file))
    apikey.discard(launch_key)
    assert not launch_key.file.exists()


def test_a_key_after_the_double_dash_is_moved_out_of_the_engine_arguments(own_dirs):
    key = _key()
    launch_key = apikey.for_launch(extra_args=["-fa", "on", "--api-key", key], split=llamacpp.split_api_key)
    assert launch_key.extra_args == ("-fa", "on")
    assert launch_key.moved == ("--api-key",)
    assert launch_key.file.read_text().strip() == key
    assert key not in json.dumps([launch_key.env, launch_key.file_ref, launch_key.extra_args])


def test_api_key_env_keeps_the_name_and_errors_never_echo_a_value(own_dirs, monkeypatch):
    key = _key()
    monkeypatch.setenv("ER_TEST_KEY", key)
    launch_key = apikey.for_launch(api_key_env="ER_TEST_KEY")
    assert launch_key.env == "ER_TEST_KEY" and key not in json.dumps([launch_key.env, launch_key.file_ref])
    monkeypatch.delenv("ER_TEST_KEY")
    with pytest.raises(BadInput, match="ER_TEST_KEY .*not set"):
        apikey.for_launch(api_key_env="ER_TEST_KEY")
    with pytest.raises(BadInput, match="name of an environment variable") as err:   # the key given by mistake
        apikey.for_launch(api_key_env=key)
    assert key not in str(err.value)


def test_two_key_options_are_refused(own_dirs):
    with pytest.raises(BadInput, match="give one of --api-key, --api-key-env and --api-key-file"):
        apikey.for_launch(api_key_env="X", extra_args=["--api-key", _key()], split=llamacpp.split_api_key)


# --------------------------------------------------------------------------- the real server
def _status(url: str, key: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=120,
                      trust_env=False).status_code


def _files_holding(key: str, *roots: Path) -> list[str]:
    """Every file under ``roots`` whose bytes contain ``key`` (SQLite files, WAL included)."""
    needle = key.encode()
    return [str(p) for root in roots for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


@pytest.mark.integration
def test_up_with_api_key_env_keeps_the_key_out_of_everything(llama_server_binary, smollm2, own_dirs):
    key = _key()
    with_key = {"ER_TEST_KEY": key}       # only the commands given it have the variable
    assert "ER_TEST_KEY" not in os.environ
    up = cli("up", "smollm2-135m", "--port", "0", "--ctx", "1024", "-t", "2", "--api-key-env", "ER_TEST_KEY",
             "--json", timeout=300, env=with_key)
    assert up.returncode == 0, up.stderr
    state = json.loads(up.stdout)
    url = f"http://{state['host']}:{state['port']}"
    try:
        assert _status(url) == 401                       # the server wants the key...
        assert _status(url, key) == 200                  # ...and takes this one
        assert key.encode() not in Path(f"/proc/{state['pid']}/cmdline").read_bytes()
        assert "--api-key-file" in state["argv"]

        # verify and bench against the managed server: its key is found without being given again,
        # from a shell that does not have the variable
        verify = cli("verify", "--json", timeout=600)
        out = json.loads(verify.stdout)
        assert verify.returncode == out["failed"] == 0, verify.stdout
        assert {r["name"]: r["status"] for r in out["results"]}["basic_answer"] == "PASS"
        bench = cli("bench", "--url", url, "--api-key-env", "ER_TEST_KEY", "--warmup", "0", "--runs", "1",
                    "--max-tokens", "16", "--json", timeout=600, env=with_key)
        assert bench.returncode == 0, bench.stderr
        bench_run = json.loads(bench.stdout)["run_id"]

        status = cli("status", "--json", check=True).stdout
        plain_status = cli("status", check=True).stdout
        runs = cli("runs", "--json", check=True).stdout
        card = cli("report", str(bench_run), check=True).stdout
        for shown in (up.stdout, status, plain_status, runs, card, verify.stdout, bench.stdout):
            assert key not in shown
        assert "ER_TEST_KEY" in status                   # the reference is what is kept
        assert _files_holding(key, own_dirs / "state", own_dirs / "data") == [
            str(f) for f in (own_dirs / "state" / "keys").iterdir()]   # only the 0600 file the engine reads
        assert json.loads(status)["state"]["args"]["api_key_env"] == "ER_TEST_KEY"

        # switch re-reads the reference: where the variable is missing it says so and stops nothing
        refused = cli("switch", "smollm2-135m", "--ctx", "512", timeout=300)
        assert refused.returncode != 0 and "ER_TEST_KEY" in refused.stderr and "Traceback" not in refused.stderr
        assert _status(url, key) == 200
        switched = cli("switch", "smollm2-135m", "--ctx", "512", "--json", timeout=300, env=with_key)
        assert switched.returncode == 0, switched.stderr
        new_state = json.loads(switched.stdout)
        assert new_state["pid"] != state["pid"]
        assert _status(url) == 401 and _status(url, key) == 200
        assert key.encode() not in Path(f"/proc/{new_state['pid']}/cmdline").read_bytes()
        assert len(list((own_dirs / "state" / "keys").iterdir())) == 1   # the old launch's file is gone
    finally:
        down = cli("down")
    assert down.returncode == 0
    assert list((own_dirs / "state" / "keys").iterdir()) == []
    assert _files_holding(key, own_dirs / "state", own_dirs / "data") == []


@pytest.mark.integration
def test_a_key_after_the_double_dash_is_moved_and_switch_keeps_it(llama_server_binary, smollm2, own_dirs):
    key = _key()
    up = cli("up", "smollm2-135m", "--port", "0", "--ctx", "1024", "-t", "2", "--json", "--", "--api-key", key,
             timeout=300)
    assert up.returncode == 0, up.stderr
    state = json.loads(up.stdout)
    url = f"http://{state['host']}:{state['port']}"
    try:
        assert key not in up.stdout and key not in json.dumps(state["args"])
        assert key.encode() not in Path(f"/proc/{state['pid']}/cmdline").read_bytes()
        assert _status(url) == 401 and _status(url, key) == 200
        switched = cli("switch", "smollm2-135m", "--ctx", "512", "--json", timeout=300)   # no key given again
        assert switched.returncode == 0, switched.stderr
        assert _status(url) == 401 and _status(url, key) == 200
    finally:
        cli("down")
    assert _files_holding(key, own_dirs / "state", own_dirs / "data") == []


@pytest.mark.integration
def test_a_group_readable_key_file_is_refused_before_anything_starts(llama_server_binary, smollm2, own_dirs):
    path = own_dirs / "key"
    path.write_text(_key() + "\n")
    path.chmod(0o640)
    proc = cli("up", "smollm2-135m", "--port", "0", "--api-key-file", str(path), timeout=300)
    assert proc.returncode != 0
    assert f"run `chmod 600 {path}`" in proc.stderr and "Traceback" not in proc.stderr
    assert cli("status").returncode == 1                 # nothing was started


@pytest.mark.integration
def test_a_server_with_a_key_gives_one_sentence_to_a_client_without_one(llama_server_binary, smollm2, own_dirs,
                                                                        tmp_path):
    """An unmanaged keyed server: no state names its key, so the client must give it."""
    from conftest import real_llama_server

    key = _key()
    key_file = tmp_path / "server-key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    with real_llama_server(llama_server_binary, smollm2, *llamacpp.api_key_file_args(key_file),
                           log_path=tmp_path / "keyed.log") as url:
        missing = cli("verify", "--url", url, timeout=120)
        assert missing.returncode != 0
        assert "the server wants an API key: pass --api-key-env VAR" in missing.stderr
        wrong = cli("verify", "--url", url, "--api-key", _key(), timeout=120)
        assert wrong.returncode != 0 and "refused the API key" in wrong.stderr
        for out in (missing, wrong):
            assert "Traceback" not in out.stderr and key not in out.stderr
        ok = cli("verify", "--url", url, "--api-key-env", "ER_TEST_KEY", "--json", timeout=600,
                 env={"ER_TEST_KEY": key})
        out = json.loads(ok.stdout)
        assert ok.returncode == out["failed"] == 0 and out["engine"] == "llama.cpp"
        assert key not in ok.stdout
