"""One registry of engine facts (issue 18 item 2): each adapter package owns its catalog entry
(``engines/<package>/catalog/engines/<id>.yaml``), and every fact that an adapter module states
beside its entry is tied to it here.

The facts the adapters read from their entry instead of stating them (llama.cpp's and the fork's
default slots, vLLM's KV aliases and its CPU build's KV types and compute dtype) are checked by
what the adapter then does. The tables an adapter must keep because they are the engine's own
vocabulary (llama-server's cache type names, vLLM's CacheDType and SpeculativeMethod, SGLang's
--kv-cache-dtype and --speculative-algorithm choices, the fork's options) are checked to cover
every id and alias the entry names. A failure names the catalog file and key, and the adapter's
module and constant.
"""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from engineroom import engines, plugins
from engineroom.catalog import Engine, load_catalog
from engineroom.catalog.load import file_name
from engineroom.engines import ikllamacpp, llamacpp, sglang, vllm
from engineroom.engines.base import LaunchOptions
from engineroom.engines.ikllamacpp import command as ik_command
from engineroom.engines.llamacpp import command as llamacpp_command
from engineroom.engines.vllm import dtype as vllm_dtype
from engineroom.errors import BadInput

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# engineroom's own adapters: entry point name -> module (pyproject.toml)
ENTRY_POINTS: dict[str, str] = PYPROJECT["project"]["entry-points"][plugins.GROUP]
ADAPTERS = {"llama.cpp": llamacpp, "ik_llama.cpp": ikllamacpp, "vllm": vllm, "sglang": sglang}


def entry(engine_id: str) -> Engine:
    found = load_catalog().engine(engine_id)
    assert found is not None, f"no catalog entry for {engine_id}"
    return found


def where(engine_id: str, key: str) -> str:
    """The catalog file and key a fact is stated under, as a failure names it."""
    (path,) = (p for d in plugins.builtin_catalog_dirs() if (p := d / "engines" / f"{engine_id}.yaml").is_file())
    return f"{file_name(path)} key '{key}'"


def kv_names(e: Engine) -> dict[str, str]:
    """Every KV name the entry accepts (ids and aliases) -> its id."""
    return {n: k.id for k in e.kv_dtypes for n in (k.id, *k.aliases)}


def spec_methods(e: Engine) -> dict[str, tuple[str, ...]]:
    """The entry's spec methods and each build's, by the key that states them."""
    out = {"spec_methods": e.spec_methods}
    out.update({f"backends.{b.id}.spec_methods": b.spec_methods for b in e.backends if b.spec_methods is not None})
    return out


@pytest.fixture
def model_file(tmp_path) -> Path:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + bytes(64))
    return path


@pytest.fixture
def model_folder(tmp_path) -> Path:
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text("{}")
    return path


# --------------------------------------------------------------------------- the entry is the adapter's
def test_each_built_in_adapter_package_owns_its_catalog_entry():
    """The entry point's name, the adapter's ENGINE, its package's one catalog file and that file's id
    are one name; the packaged catalog holds no engine of its own."""
    assert set(ENTRY_POINTS) == set(ADAPTERS), "pyproject.toml's entry points vs the adapters tested here"
    installed = {ep.name: ep.value for ep in metadata.entry_points(group=plugins.GROUP)
                 if ep.dist is not None and ep.dist.name == "engineroom"}
    assert not installed or installed == ENTRY_POINTS, "reinstall: the installed entry points are not pyproject's"
    folders = {d.parent.name: d for d in plugins.builtin_catalog_dirs()}
    for name, module in ENTRY_POINTS.items():
        package = module.rsplit(".", 1)[-1]
        assert package in folders, f"{module} ships no catalog folder (catalog/engines/{name}.yaml)"
        files = sorted((folders.pop(package) / "engines").glob("*.yaml"))
        assert [f.name for f in files] == [f"{name}.yaml"], f"{module}'s catalog/engines/ holds {files}"
        assert ADAPTERS[name].ENGINE == name == entry(name).id, f"{where(name, 'id')} vs {module}.ENGINE"
        assert engines.adapter(name).impl is ADAPTERS[name]
    assert not folders, f"catalog folders of no registered adapter: {sorted(folders)}"
    assert {e.id for e in load_catalog().engines} == set(ENTRY_POINTS)
    assert engines.DEFAULT_ENGINE in ENTRY_POINTS and ikllamacpp.FAMILY in ENTRY_POINTS


def test_every_name_of_an_engine_resolves_alike_in_fit_plan_recipe_and_up():
    """One resolver: the catalog's (``Catalog.engine``: an id, the entry's name or an alias, any case)
    behind fit's ``engine_spec``, plan's ``find_engine``, and ``engines.resolve``, which recipe and up
    use (``flows.picks.typed_request``); a name none knows is refused, or handed back as given."""
    from engineroom.catalog import find_engine
    from engineroom.fit.engine import engine_spec
    from engineroom.flows.picks import typed_request
    from engineroom.launchargs import LaunchArgs

    cat = load_catalog()
    for e in cat.engines:
        for name in {e.id, e.name, *e.aliases, e.id.upper(), f" {e.id} "}:
            said = f"{name!r} ({where(e.id, 'aliases')})"
            assert find_engine(cat, name).id == e.id, said
            assert engine_spec(name, cat).id == e.id, said
            assert engines.resolve(name) == e.id and engines.adapter(name).name == e.id, said
            assert typed_request("m", None, LaunchArgs(engine=name), "llama.cpp").engine == e.id, said
    with pytest.raises(BadInput, match="unknown engine 'tgi'"):
        engine_spec("tgi", cat)
    assert engines.resolve("tgi") == "tgi" and not engines.has_adapter("tgi")


def test_the_commands_take_an_alias_as_the_id(tmp_path, monkeypatch):
    """`fit`, `plan`, `recipe` and `up --dry-run` with --engine llamacpp (an alias) each answer for
    llama.cpp, as they do given its id (fit's table title repeats the name as typed: its JSON here)."""
    from conftest import cli

    monkeypatch.setenv("ENGINEROOM_DATA_DIR", str(tmp_path))          # no engine installed: nothing to ask
    for args in (("fit", "smollm2-135m", "--quant", "Q4_1", "--kv", "f16", "--ctx", "2048", "--rig", "cpu:16GB",
                  "--json"),
                 ("plan", "smollm2-135m", "--rig", "cpu:16GB"),
                 ("recipe", "smollm2-135m", "--rig", "cpu:16GB"),
                 ("up", "smollm2-135m", "--rig", "cpu:16GB", "--dry-run")):
        by_alias = cli(*args, "--engine", "llamacpp")
        by_id = cli(*args, "--engine", "llama.cpp")
        assert by_alias.returncode == 0, (args, by_alias.stderr[-2000:])
        assert (by_alias.returncode, by_alias.stdout, by_alias.stderr) == (by_id.returncode, by_id.stdout,
                                                                           by_id.stderr), args


# --------------------------------------------------------------------------- KV cache types
def test_llama_cpp_and_the_forks_cache_type_tables_are_their_entries_kv_types():
    """llama-server's -ctk / -ctv name for every KV type the entry sizes, and no other."""
    for e, module in ((entry("llama.cpp"), "llamacpp/command.py"), (entry("ik_llama.cpp"), "ikllamacpp/command.py")):
        table = ADAPTERS[e.id].KV_CACHE_TYPES
        assert set(table) == set(kv_names(e)), (f"{where(e.id, 'kv_dtypes')}: {sorted(kv_names(e))} vs {module} "
                                                f"KV_CACHE_TYPES {sorted(table)}")
        for b in e.backends:
            extra = set(b.kv_dtypes or ()) - set(table)
            assert not extra, f"{where(e.id, f'backends.{b.id}.kv_dtypes')}: {sorted(extra)} not in {module}"
    fork = entry("ik_llama.cpp")
    unquantised = {k.id for k in fork.kv_dtypes if k.bytes_per_elem >= 2}
    assert set(ik_command.UNQUANTISED_KV) == unquantised, \
        f"{where(fork.id, 'kv_dtypes')}: 2 bytes or more {sorted(unquantised)} vs ikllamacpp/command.py UNQUANTISED_KV"


def test_sglangs_kv_table_takes_every_name_of_its_entry_to_a_value_sglang_takes():
    e = entry("sglang")
    for name, kv_id in kv_names(e).items():
        said = f"{where(e.id, 'kv_dtypes')} {name!r} vs sglang/command.py KV_CACHE_DTYPES"
        assert name in sglang.KV_CACHE_DTYPES, said
        assert sglang.KV_CACHE_DTYPES[name] == sglang.KV_CACHE_DTYPES[kv_id], f"{said}: an alias of {kv_id}"
        assert sglang.kv_cache_dtype(name) in sglang.SGLANG_KV_DTYPES, f"{said}: not one of SGLANG_KV_DTYPES"
        settled = sglang.launch_settings(LaunchOptions(model_path=Path("/m"), kv_dtype=name))
        assert e.kv(settled.kv_dtype) is not None and e.kv(settled.kv_dtype).id == kv_id, said


def test_vllms_kv_names_are_its_entries_and_vllms_own():
    """vLLM's adapter reads its KV aliases and its CPU build's types from the entry; every type the
    entry sizes but the one only fit sizes (``compute_dtype.kv_auto``) is a value of vLLM's CacheDType."""
    e = entry("vllm")
    cpu = e.backend_for("cpu")
    assert cpu is not None and cpu.compute_dtype is not None
    fit_only = cpu.compute_dtype.kv_auto
    for name, kv_id in kv_names(e).items():
        assert vllm.kv_name(name) == kv_id, f"{where(e.id, 'kv_dtypes')} {name!r}"
        said = f"{where(e.id, 'kv_dtypes')} {kv_id!r} vs vllm/command.py VLLM_KV_DTYPES"
        assert (kv_id in vllm.VLLM_KV_DTYPES) is (kv_id != fit_only), said
    assert vllm.cpu_kv_dtypes() == tuple(k for k in cpu.kv_dtypes if k != fit_only), \
        where(e.id, "backends.cpu.kv_dtypes")
    rule = cpu.compute_dtype
    assert vllm_dtype.fit_quant(rule.value) == rule.weights_quant, \
        where(e.id, "backends.cpu.compute_dtype.weights_quant")


# --------------------------------------------------------------------------- speculative decoding, options
SPEC_TABLES = {"llama.cpp": ("llamacpp/command.py SPEC_TYPES", llamacpp_command.SPEC_TYPES),
               "ik_llama.cpp": ("ikllamacpp/command.py SPEC_KINDS", ik_command.SPEC_KINDS),
               "vllm": ("vllm/command.py SPEC_METHODS", vllm.SPEC_METHODS),
               "sglang": ("sglang/command.py SPEC_ALGORITHMS", sglang.SPEC_ALGORITHMS)}


def test_every_spec_method_an_entry_lists_is_one_its_adapter_renders():
    for engine_id, (table_name, table) in SPEC_TABLES.items():
        for key, methods in spec_methods(entry(engine_id)).items():
            missing = set(methods) - set(table)
            assert not missing, f"{where(engine_id, key)}: {sorted(missing)} not in {table_name}"


def test_vllms_cpu_build_lists_no_spec_method_as_the_adapter_refuses_them():
    cpu = entry("vllm").backend_for("cpu")
    assert cpu is not None and cpu.spec_methods == (), where("vllm", "backends.cpu.spec_methods")
    with pytest.raises(BadInput, match="CPU build does not support speculative decoding"):
        vllm.check_spec_config(["--speculative-config", '{"method": "ngram"}'], cpu=True)


def test_the_forks_planned_options_are_ones_its_adapter_defines():
    e = entry("ik_llama.cpp")
    missing = set(e.plan_options) - set(ikllamacpp.ENGINE_OPTIONS)
    assert not missing, f"{where(e.id, 'plan_options')}: {sorted(missing)} not in ikllamacpp ENGINE_OPTIONS"


# --------------------------------------------------------------------------- launch defaults and flags
def test_a_launch_without_slots_runs_the_entrys_default_parallel(model_file, model_folder):
    """fit's default launch (``default_parallel`` / ``default_kv_unified``) is what each adapter launches
    when no slot count is given: llama.cpp and the fork read it from their entry, vLLM and SGLang run 1."""
    for engine_id, module in ADAPTERS.items():
        e = entry(engine_id)
        path = model_file if engine_id in ("llama.cpp", "ik_llama.cpp") else model_folder
        settled = module.launch_settings(LaunchOptions(model_path=path))
        assert settled.parallel == e.default_parallel, f"{where(engine_id, 'default_parallel')} vs {module.__name__}"
    e = entry("llama.cpp")
    assert llamacpp.launch_defaults() == (e.default_parallel, e.default_kv_unified), where(e.id, "default_kv_unified")
    argv = llamacpp.render(llamacpp.placeholder_binary(), LaunchOptions(model_path=model_file)).argv
    assert argv[argv.index("-np") + 1] == str(e.default_parallel) and "--kv-unified" in argv
    fork = entry("ik_llama.cpp")
    assert ik_command.default_parallel() == fork.default_parallel, where(fork.id, "default_parallel")


def test_the_split_fit_and_plan_quote_is_the_one_the_adapter_renders(model_file):
    """``multi_gpu.split_args`` (what fit and plan messages quote) is what a two-GPU launch is given."""
    for engine_id in ("llama.cpp", "ik_llama.cpp"):
        e = entry(engine_id)
        quoted = e.multi_gpu.split_args.split()
        module = ADAPTERS[engine_id]
        argv = list(module.render(module.placeholder_binary(), LaunchOptions(model_path=model_file, tp=2)).argv)
        at = argv.index(quoted[0]) if quoted and quoted[0] in argv else -1
        assert at >= 0 and argv[at:at + len(quoted)] == quoted, f"{where(engine_id, 'multi_gpu.split_args')}: {argv}"
    assert entry("ik_llama.cpp").multi_gpu.split_args.split()[-1] in ikllamacpp.SPLIT_MODES


def test_vllms_cpu_kv_space_is_set_by_the_variable_and_unit_the_entry_names(model_folder, monkeypatch):
    space = entry("vllm").backend_for("cpu").kv_cache_space
    assert space is not None
    assert vllm.KVCACHE_SPACE_ENV == space.env, f"{where('vllm', 'backends.cpu.kv_cache_space.env')}"
    monkeypatch.setenv(space.env, "3")
    spec = vllm.render(vllm.placeholder_binary(), LaunchOptions(model_path=model_folder))
    assert spec.env[space.env] == "3"
    settled = vllm.launch_settings(LaunchOptions(model_path=model_folder))
    assert settled.kv_space_bytes == 3 * space.unit_bytes, where("vllm", "backends.cpu.kv_cache_space.unit_bytes")


# --------------------------------------------------------------------------- versions
def test_the_versions_the_entries_and_pyproject_name_are_the_adapters_pins():
    """A docker entry whose source says which release the adapter installs names the adapter's RELEASE
    (the tag's {release} is filled by it: tests/test_parsers_in_product.py); pyproject.toml's [cpu] extra
    pins the llama.cpp source package the adapter builds."""
    for engine_id in ADAPTERS:
        docker = entry(engine_id).docker
        if docker is None or "adapter installs" not in docker.source:
            continue
        release = engines.adapter(engine_id).release
        said = re.findall(r"\bv?b?(\d+(?:\.\d+)*)\b[^;]*?adapter installs", docker.source)
        assert said and set(said) == {release}, f"{where(engine_id, 'docker.source')}: {said} vs RELEASE {release}"
    cpu_extra = PYPROJECT["project"]["optional-dependencies"]["cpu"]
    assert cpu_extra == [f"{llamacpp.SOURCE_PACKAGE}=={llamacpp.SOURCE_VERSION}"], \
        "pyproject.toml [project.optional-dependencies] cpu vs llamacpp/discovery.py SOURCE_PACKAGE / SOURCE_VERSION"
