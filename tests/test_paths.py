"""Where engineroom keeps things: platformdirs' places, which on Linux are the XDG paths of old.

The expected paths below are the XDG Base Directory rules written out by hand (the rules the
old hand-rolled lookup implemented), so a platformdirs release that moved anything on Linux
would fail here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from engineroom import paths

OVERRIDES = ("ENGINEROOM_HOME", "ENGINEROOM_CACHE_DIR", "ENGINEROOM_STATE_DIR", "ENGINEROOM_DATA_DIR")
XDG = {"XDG_CACHE_HOME": ".cache", "XDG_STATE_HOME": ".local/state", "XDG_DATA_HOME": ".local/share"}


@pytest.fixture
def bare_env(tmp_path, monkeypatch):
    """No engineroom override and no XDG variable; HOME is a fresh folder."""
    for var in (*OVERRIDES, *XDG):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the XDG paths are Linux's")


@linux_only
def test_defaults_are_the_xdg_defaults_under_home(bare_env):
    assert paths.cache_dir() == bare_env / ".cache" / "engineroom"
    assert paths.state_dir() == bare_env / ".local" / "state" / "engineroom"
    assert paths.data_dir() == bare_env / ".local" / "share" / "engineroom"
    assert paths.models_dir() == bare_env / ".cache" / "engineroom" / "models"
    assert paths.db_path() == bare_env / ".local" / "share" / "engineroom" / "results.sqlite"
    assert all(p.is_dir() for p in (paths.cache_dir(), paths.state_dir(), paths.data_dir()))


@linux_only
def test_xdg_variables_are_still_honoured(bare_env, tmp_path, monkeypatch):
    for var in XDG:
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    assert paths.cache_dir() == tmp_path / "xdg_cache_home" / "engineroom"
    assert paths.state_dir() == tmp_path / "xdg_state_home" / "engineroom"
    assert paths.data_dir() == tmp_path / "xdg_data_home" / "engineroom"


@linux_only
def test_an_empty_xdg_variable_means_the_default(bare_env, monkeypatch):
    for var in XDG:
        monkeypatch.setenv(var, "")
    for var, default in XDG.items():
        getter = {"XDG_CACHE_HOME": paths.cache_dir, "XDG_STATE_HOME": paths.state_dir,
                  "XDG_DATA_HOME": paths.data_dir}[var]
        assert getter() == bare_env / default / "engineroom"


def test_engineroom_home_moves_all_three(bare_env, tmp_path, monkeypatch):
    monkeypatch.setenv("ENGINEROOM_HOME", str(tmp_path / "er"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "ignored"))
    assert paths.cache_dir() == tmp_path / "er" / "cache"
    assert paths.state_dir() == tmp_path / "er" / "state"
    assert paths.data_dir() == tmp_path / "er" / "data"
    assert not (tmp_path / "ignored").exists()


def test_the_finer_overrides_win_over_engineroom_home(bare_env, tmp_path, monkeypatch):
    monkeypatch.setenv("ENGINEROOM_HOME", str(tmp_path / "er"))
    monkeypatch.setenv("ENGINEROOM_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("ENGINEROOM_STATE_DIR", str(tmp_path / "s"))
    monkeypatch.setenv("ENGINEROOM_DATA_DIR", str(tmp_path / "d"))
    assert (paths.cache_dir(), paths.state_dir(), paths.data_dir()) == (tmp_path / "c", tmp_path / "s", tmp_path / "d")


def test_overrides_expand_a_tilde(bare_env, monkeypatch):
    monkeypatch.setenv("ENGINEROOM_DATA_DIR", "~/results")
    assert paths.data_dir() == Path(bare_env) / "results"


def test_the_dependency_is_declared():
    """platformdirs and numpy are imported by engineroom, so pyproject.toml must name them."""
    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    names = {dep.split(">")[0].split("=")[0].split("[")[0].strip().lower() for dep in project["dependencies"]}
    assert {"platformdirs", "numpy"} <= names
