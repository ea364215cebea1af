"""One byte convention (units.py): binary units for memory and files, decimal GB only for
vendor / catalog capacities, shown beside the binary figure."""

from __future__ import annotations

import json
import re

import pytest

from engineroom import units

from conftest import cli


@pytest.mark.parametrize("n, text", [
    (0, "0 B"),
    (512, "512 B"),
    (1536, "1.5 KiB"),
    (90_000_000, "85.8 MiB"),          # SmolLM2's file: 90 MB is 85.8 MiB
    (8 * 1024**3, "8.0 GiB"),
    (1023.96 * 1024**2, "1024.0 MiB"),   # rounds up but stays in its unit
    (2 * 1024**4, "2.0 TiB"),
    (-3 * 1024**2, "-3.0 MiB"),
    (None, "?"),
    (float("nan"), "?"),
    ("12", "?"),
])
def test_mem_picks_a_binary_unit(n, text):
    assert units.mem(n) == text


def test_fixed_units_and_vendor_gb():
    assert units.gib(24 * 10**9) == "22.4 GiB"
    assert units.gib(24 * 1024**3, 2) == "24.00 GiB"
    assert units.mib(4608 * 1024**2) == "4608.00 MiB"     # as llama.cpp prints a KV buffer
    assert units.gb(24 * 10**9) == "24.0 GB"
    assert units.capacity(24 * 10**9) == "22.4 GiB (24.0 GB)"
    assert units.gib(24 * 10**9, unit=False) == "22.4"      # a column headed "GiB / device"
    assert units.gib(None, unit=False) == units.gib(None) == units.gb(None) == units.capacity(None) == "?"
    assert units.mem(None, missing="") == ""


def test_fit_command_prints_memory_in_gib_and_capacity_in_both():
    proc = cli("fit", "qwen3.6-27b", "--engine", "llama.cpp", "--quant", "Q4_K_M", "--kv", "q4_0",
               "--ctx", "32768", "--rig", "1x3090")
    assert proc.returncode in (0, 1), proc.stderr           # 1 = does not fit; the output is what counts
    out = proc.stdout
    assert "GiB" in out
    assert re.search(r"of 24\.0 GiB \(25\.8 GB\)", out), out      # the 3090: 24,576 MiB as it reports it, both units
    # decimal GB appears only as the capacity's vendor figure in parentheses; every size is binary
    assert len(re.findall(r"\d GB\b", out)) == len(re.findall(r"\(\d+\.\d GB\)", out)), out
    verdict = next(line for line in out.splitlines() if line.startswith("verdict:"))
    assert "GiB" in verdict and " GB" not in verdict, verdict


def test_models_list_and_pull_show_binary_sizes(smollm2):
    size = smollm2.stat().st_size
    listed = cli("models", "list", check=True).stdout
    assert units.mem(size) in listed and units.mem(size).endswith("MiB"), listed
    rows = json.loads(cli("models", "list", "--json", check=True).stdout)
    assert any(r.get("size") == size for r in rows)        # JSON keeps exact bytes
    pulled = cli("models", "pull", "smollm2-135m", check=True).stdout
    assert f"({units.mem(size)})" in pulled


def test_plan_table_is_per_device_gib():
    proc = cli("plan", "qwen3.6-27b", "--rig", "2x3090", "--priority", "balanced", check=True)
    assert "GiB / device" in proc.stdout and "GB / device" not in proc.stdout.replace("GiB / device", "")


def test_fit_plan_and_catalog_format_bytes_only_through_units():
    """One byte formatter: no stage of the pipeline, and neither the command line nor its views,
    divides by a unit to print it or keeps a byte formatter of its own (the card keeps a thin
    wrapper over units.mem, so report/ is held to the first rule only)."""
    from pathlib import Path

    src = Path(units.__file__).parent
    divides = r"/ ?(KiB|MiB|GiB|TiB|1024)\b"
    stage = re.compile(divides + r"|def _(gb|gib|mib|bytes)\(")
    # the command line's old helpers by name too (plan's _capacity is a sum of bytes, not text)
    shown = re.compile(divides + r"|def _(gb1?|gib|mib|bytes|capacity|per_device)\(")
    rules = [(p, stage) for pkg in ("fit", "plan", "catalog") for p in sorted((src / pkg).glob("*.py"))]
    rules += [(p, shown) for p in sorted((src / "cli").glob("*.py"))] + [(src / "views.py", shown)]
    rules += [(p, re.compile(divides)) for p in sorted((src / "report").glob("*.py"))]
    found = [f"{p.relative_to(src)}:{i}" for p, rule in rules
             for i, line in enumerate(p.read_text().splitlines(), 1) if rule.search(line)]
    assert found == []
    # and the formatter they use prints what the breakdown showed before (llama.cpp's MiB lines)
    assert units.mib(0.02 * units.MiB) == "0.02 MiB" and units.gib(22.4 * units.GiB, 2) == "22.40 GiB"
