"""The one model-reference grammar (refs.py): every form, the folder-with-both rule, the
revision-keyed cache, and one-sentence errors. GGUF files are real ones written by synth."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from engineroom import models, paths, refs
from engineroom.errors import BadInput, NotFound
from engineroom.refs import ModelFormat, RefKind, SourceKind

CONFIGS = Path(__file__).parent / "fixtures" / "configs"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory) -> Path:
    """A real, small random-weight GGUF (byte-level vocab), written by engineroom.synth."""
    from engineroom.synth import write_synthetic_gguf
    from engineroom.synthshapes import SHAPES

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ENGINEROOM_TOKENIZER_GGUF", str(tmp_path_factory.mktemp("none") / "absent.gguf"))
        return write_synthetic_gguf(replace(SHAPES["dense-s"], vocab_size=1024), "Q4_0",
                                    tmp_path_factory.mktemp("gguf") / "dense-s-Q4_0.gguf")


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch) -> Path:
    """A model cache of each test's own: the hub copies, legacy layouts and pulls written here would
    otherwise be found by the next session that shares ENGINEROOM_CACHE_DIR (a pre-revision copy
    already moved, a revision already pulled)."""
    monkeypatch.setenv("ENGINEROOM_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _copy(src: Path, dst: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(src.read_bytes())
    return dst


# ---- every form ---------------------------------------------------------------------------

def test_packaged_and_catalog_names():
    packaged = models.packaged_models()
    ref = refs.parse("smollm2", packaged=packaged)                 # a catalog alias of the packaged quant
    assert (ref.kind, ref.name, ref.catalog_id) == (RefKind.PACKAGED, "smollm2-135m", "smollm2-135m")
    assert ref.path == paths.models_dir() / "smollm2-135m" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert ref.format is ModelFormat.GGUF
    cat = models.resolve("meta-llama/Llama-3.1-8B-Instruct")      # a catalog model's HF repo
    assert (cat.kind, cat.catalog_id, cat.format) == (RefKind.CATALOG, "llama-3.1-8b", None)
    assert cat.arch_source() == refs.ArchSource(SourceKind.CATALOG, "llama-3.1-8b")
    # without the catalog passed in, the same text is a Hugging Face repo id
    assert refs.parse("meta-llama/Llama-3.1-8B-Instruct").kind is RefKind.HF_REPO


def test_local_gguf_config_and_folders(tmp_path, gguf_file):
    g = _copy(gguf_file, tmp_path / "one" / "model.gguf")
    assert refs.parse(str(g)).kind is RefKind.GGUF
    folder = refs.parse(str(g.parent))
    assert (folder.kind, folder.path, folder.folder, folder.name) == (RefKind.GGUF, g, g.parent, "model")
    blob = _copy(gguf_file, tmp_path / "blobs" / "5f3a9c")           # a hub snapshot: model.gguf -> blob
    (tmp_path / "snap").mkdir()
    (tmp_path / "snap" / "model.gguf").symlink_to(blob)
    linked = refs.parse(str(tmp_path / "snap" / "model.gguf"))
    assert (linked.kind, linked.path, linked.name) == (RefKind.GGUF, tmp_path / "snap" / "model.gguf", "model")
    cfg = _copy(CONFIGS / "smollm2-135m.json", tmp_path / "ckpt" / "config.json")
    named = refs.parse(str(cfg))
    assert (named.kind, named.path, named.name, named.format) == (RefKind.CONFIG, cfg, "ckpt", ModelFormat.CHECKPOINT)
    as_folder = refs.parse(str(cfg.parent))
    assert (as_folder.kind, as_folder.path, as_folder.model_dir) == (RefKind.CONFIG, cfg, cfg.parent)
    assert as_folder.arch_source() == refs.ArchSource(SourceKind.CONFIG, str(cfg), name="ckpt")


def test_hf_file_repo_and_url_forms():
    f = refs.parse("hf:unsloth/Qwen3.6-27B-GGUF/sub/Qwen3.6-27B-Q4_K_M.gguf@v2")
    assert (f.kind, f.repo, f.filename, f.revision, f.name) == (
        RefKind.HF_FILE, "unsloth/Qwen3.6-27B-GGUF", "sub/Qwen3.6-27B-Q4_K_M.gguf", "v2", "Qwen3.6-27B-Q4_K_M")
    src = f.arch_source()                    # not pulled: the hub's URL at that revision
    assert src.kind is SourceKind.GGUF_URL and "/resolve/v2/sub/Qwen3.6-27B-Q4_K_M.gguf" in src.location
    r = refs.parse("Qwen/Qwen3.6-27B@" + COMMIT)
    assert (r.kind, r.repo, r.revision, r.format) == (RefKind.HF_REPO, "Qwen/Qwen3.6-27B", COMMIT,
                                                      ModelFormat.CHECKPOINT)
    assert r.arch_source() == refs.ArchSource(SourceKind.HUB_CONFIG, "Qwen/Qwen3.6-27B", COMMIT, "Qwen/Qwen3.6-27B")
    u = refs.parse("https://example.com/models/tiny-Q8_0.gguf")
    assert (u.kind, u.name, u.arch_source().location) == (RefKind.URL, "tiny-Q8_0", "https://example.com/models/tiny-Q8_0.gguf")


def test_existing_path_beats_an_hf_id_and_dot_slash_forces_it(tmp_path, monkeypatch, gguf_file):
    _copy(gguf_file, tmp_path / "org" / "repo" / "m.gguf")
    monkeypatch.chdir(tmp_path)
    assert refs.parse("org/repo").kind is RefKind.GGUF
    _copy(gguf_file, tmp_path / "smollm2-135m" / "x.gguf")
    assert models.resolve("smollm2-135m").kind is RefKind.PACKAGED
    assert models.resolve("./smollm2-135m").kind is RefKind.GGUF
    monkeypatch.chdir("/")
    assert refs.parse("org/repo").kind is RefKind.HF_REPO


# ---- the folder holding both a config.json and a GGUF ----------------------------------------

def test_folder_with_both_plans_and_serves_the_same_gguf(tmp_path, gguf_file):
    """`plan DIR` / `fit DIR` and `up DIR` must read the same file: the folder's one GGUF."""
    from engineroom.arch import arch_from_gguf, load_arch
    from engineroom.plan import resolve_model

    folder = tmp_path / "both"
    g = _copy(gguf_file, folder / "dense-s-Q4_0.gguf")
    _copy(CONFIGS / "llama-3.1-8b.json", folder / "config.json")
    mref = models.resolve(str(folder))
    _, served = models.local_model(str(folder))            # what `up` hands the engine
    source = mref.arch_source()                             # what plan and fit read
    assert served == g and source == refs.ArchSource(SourceKind.GGUF, str(g))
    read = load_arch(str(folder))
    assert read.source == "gguf" and read.weight_bytes_exact == arch_from_gguf(g).weight_bytes_exact
    assert resolve_model(str(folder)).source.startswith("GGUF header of")
    # naming the config.json means the checkpoint
    assert load_arch(str(folder / "config.json")).param_count == 8_030_261_248


def test_folder_with_several_ggufs_is_refused(tmp_path, gguf_file):
    _copy(gguf_file, tmp_path / "a.gguf")
    _copy(gguf_file, tmp_path / "b.gguf")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(BadInput, match=r"holds 2 GGUF files \(a.gguf, b.gguf\); name one file") as err:
        refs.parse(str(tmp_path))
    assert "\n" not in str(err.value)


# ---- revision-keyed cache -------------------------------------------------------------------

def test_revisions_get_their_own_cache_paths():
    base = "hf:org/repo/dir/model.gguf"
    v1, v2, bare, main, commit, pr = (refs.parse(base + rev).path for rev in
                                      ("@v1", "@v2", "", "@main", "@" + COMMIT, "@refs/pr/1"))
    root = paths.models_dir() / "hf" / "org" / "repo"
    assert v1 == root / "@v1" / "dir" / "model.gguf" and v2 == root / "@v2" / "dir" / "model.gguf"
    assert bare == main == root / "@main" / "dir" / "model.gguf"       # no revision: the default branch
    assert commit == root / f"@{COMMIT}" / "dir" / "model.gguf"
    assert pr == root / "@refs%2Fpr%2F1" / "dir" / "model.gguf"         # one path component per revision
    assert len({v1, v2, main, commit, pr}) == 5


def test_a_pulled_revision_is_served_and_read_but_not_another(tmp_path, monkeypatch, gguf_file):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    v1 = models.resolve("hf:org/cached-repo/m.gguf@v1")
    _copy(gguf_file, v1.path)
    _, served = models.local_model(v1.raw, download=False)
    assert served == v1.path
    assert v1.arch_source() == refs.ArchSource(SourceKind.GGUF, str(v1.path), name="org/cached-repo/m.gguf")
    with pytest.raises(NotFound, match="not cached"):
        models.local_model("hf:org/cached-repo/m.gguf@v2", download=False)
    listed = {m.name for m in models.list_cached()}
    assert "hf:org/cached-repo/m.gguf@v1" in listed


def _offline(monkeypatch) -> None:
    """The hub unreachable, as huggingface_hub sees it (it reads HF_HUB_OFFLINE at import)."""
    import huggingface_hub.constants as hc

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True, raising=False)


def _legacy_copy(gguf_file: Path, repo: str, filename: str, commit: str) -> Path:
    """A file as the pre-revision layout left it, with huggingface_hub's own download record."""
    from huggingface_hub._local_folder import write_download_metadata

    legacy_dir = paths.models_dir() / "hf" / repo
    old = _copy(gguf_file, legacy_dir / filename)
    write_download_metadata(local_dir=legacy_dir, filename=filename, commit_hash=commit, etag="abc")
    return old


def test_pre_revision_copy_is_moved_under_the_commit_it_records(gguf_file, monkeypatch):
    _offline(monkeypatch)
    old = _legacy_copy(gguf_file, "org/legacy", "sub/m.gguf", COMMIT)
    # a branch cannot be matched to the copy offline: it is neither served nor moved
    with pytest.raises(NotFound, match="not cached"):
        models.local_model("hf:org/legacy/sub/m.gguf", download=False)
    with pytest.raises(NotFound, match="no copy of that revision is cached"):
        models.pull("hf:org/legacy/sub/m.gguf@v9")
    assert old.is_file()
    # the commit it records finds it, and it moves into the new layout with its record
    mref, served = models.local_model(f"hf:org/legacy/sub/m.gguf@{COMMIT}", download=False)
    assert served == mref.path == paths.models_dir() / "hf" / "org" / "legacy" / f"@{COMMIT}" / "sub" / "m.gguf"
    assert not old.exists() and served.read_bytes() == gguf_file.read_bytes()
    # huggingface_hub itself accepts the moved copy for that commit with no network
    assert models.pull(f"hf:org/legacy/sub/m.gguf@{COMMIT}") == served


# ---- errors ---------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [
    "", "   ", "nonsense-model", "???", "not a ref at all", "hf:org/repo", "hf:org/repo/config.json",
    "hf:org/repo/../../etc/x.gguf", "hf:org/repo/x.gguf@.hidden", "https://example.com/model.bin", "https://",
])
def test_bad_references_are_one_sentence(bad):
    with pytest.raises(BadInput) as err:
        models.resolve(bad)
    msg = str(err.value)
    assert "\n" not in msg and msg.endswith(".")
    if bad.strip() in ("", "nonsense-model", "???", "not a ref at all"):
        assert "hf:ORG/REPO/FILE.gguf[@REVISION]" in msg and "ORG/REPO[@REVISION]" in msg


def test_missing_and_unreadable_paths(tmp_path):
    with pytest.raises(NotFound, match="does not exist"):
        refs.parse(str(tmp_path / "nowhere" / "model.gguf"))
    odd = tmp_path / "weights.bin"
    odd.write_bytes(b"\0" * 16)
    with pytest.raises(BadInput, match="neither a config.json nor a GGUF"):
        refs.parse(str(odd))
    with pytest.raises(BadInput, match="no .gguf file and no config.json"):
        refs.parse(str(tmp_path))


def test_parsing_opens_no_file(tmp_path, monkeypatch, gguf_file):
    """Parse-only: listing and stat calls, never an open (so `models resolve` has no side effects)."""
    import builtins
    import io

    g = _copy(gguf_file, tmp_path / "m.gguf")
    (tmp_path / "config.json").write_text("{}")

    def refuse(*_a, **_k):
        raise AssertionError("refs opened a file")

    monkeypatch.setattr(builtins, "open", refuse)
    monkeypatch.setattr(io, "open", refuse)
    assert refs.parse(str(tmp_path)).path == g
    assert refs.parse(str(tmp_path / "config.json")).kind is RefKind.CONFIG


def test_refs_imports_no_later_stage():
    """refs sits below catalog, arch, fit and plan: importing it loads none of them."""
    code = ("import json, sys, engineroom.refs; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'engineroom')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(json.loads(out))
    assert "engineroom.refs" in loaded
    assert not loaded & {"engineroom.catalog", "engineroom.arch", "engineroom.fit", "engineroom.plan",
                         "engineroom.models"}


def test_models_resolve_on_the_cli(tmp_path, gguf_file):
    from conftest import cli

    folder = tmp_path / "both"
    g = _copy(gguf_file, folder / "m.gguf")
    (folder / "config.json").write_text("{}")
    proc = cli("models", "resolve", str(folder), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert (data["kind"], data["path"]) == ("gguf", str(g))
    bad = cli("models", "resolve", "nonsense-model")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert len([ln for ln in bad.stderr.splitlines() if ln.strip()]) == 1


@pytest.fixture
def stand_in_hub(monkeypatch):
    """A stand-in for the Hugging Face hub on 127.0.0.1 (the real one is not reachable from the
    tests): it answers huggingface_hub's HEAD and GET for files under /ORG/REPO/resolve/REV/,
    from ``files[(rev, filename)] = (etag, bytes)``, and logs every request it serves."""
    import http.server
    import threading

    import huggingface_hub.constants as hc

    files: dict[tuple[str, str], tuple[str, bytes]] = {}
    log: list[tuple[str, str]] = []

    class Hub(http.server.BaseHTTPRequestHandler):
        def _answer(self, body: bool) -> None:
            log.append((self.command, self.path))
            parts = self.path.split("?")[0].split("/", 5)       # '', org, repo, 'resolve', rev, file
            hit = files.get((parts[4], parts[5])) if len(parts) == 6 and parts[3] == "resolve" else None
            if hit is None:
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            etag, data = hit
            self.send_response(200)
            self.send_header("ETag", f'"{etag}"')
            self.send_header("X-Repo-Commit", COMMIT if parts[4] == "main" else "f" * 40)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data)

        def do_HEAD(self):
            self._answer(False)

        def do_GET(self):
            self._answer(True)

        def log_message(self, *_a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    monkeypatch.setattr(hc, "ENDPOINT", base)           # what HF_ENDPOINT sets, read at import
    monkeypatch.setattr(hc, "HUGGINGFACE_CO_URL_TEMPLATE", base + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", False, raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield files, log
    server.shutdown()


def test_pre_revision_copy_is_adopted_by_the_branch_whose_etag_it_has(gguf_file, stand_in_hub):
    files, log = stand_in_hub
    old = _legacy_copy(gguf_file, "org/moved", "m.gguf", "e" * 40)     # recorded ETag: "abc"
    files[("v2", "m.gguf")] = ("def", b"GGUF another revision's bytes")
    v2 = models.pull("hf:org/moved/m.gguf@v2")          # the hub's ETag for v2 differs: downloaded anew
    assert v2.read_bytes() == b"GGUF another revision's bytes" and old.is_file()
    assert ("GET", "/org/moved/resolve/v2/m.gguf") in log
    files[("main", "m.gguf")] = ("abc", gguf_file.read_bytes())
    log.clear()
    main = models.pull("hf:org/moved/m.gguf")           # same ETag: the old copy moves, nothing is downloaded
    assert main == refs.parse("hf:org/moved/m.gguf").path and not old.exists()
    assert main.read_bytes() == gguf_file.read_bytes()
    assert not [r for r in log if r[0] == "GET"]


def test_up_on_a_checkpoint_folder_is_refused_by_the_adapter(tmp_path, llama_server_binary):
    """models says the folder is a checkpoint; llama.cpp's adapter refuses it in one sentence,
    before anything starts."""
    from conftest import cli

    ckpt = tmp_path / "ckpt"
    _copy(CONFIGS / "smollm2-135m.json", ckpt / "config.json")
    assert models.local_model(str(ckpt))[1] == ckpt
    proc = cli("up", str(ckpt), "--port", "0")
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode != 0 and len(lines) == 1 and "Traceback" not in proc.stderr
    assert "one GGUF file" in lines[0] and str(ckpt) in lines[0]
