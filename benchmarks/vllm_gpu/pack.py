#!/usr/bin/env python3
"""On this machine: the wheels of wheels.txt (+ SmolLM2's GGUF) as parts small enough to carry.

    .venv/bin/python benchmarks/vllm_gpu/pack.py [--part-mib N] [--no-gguf]
    .venv/bin/python benchmarks/vllm_gpu/pack.py --engine sglang   # wheels-sglang.txt -> .ci-work/sglang_gpu/

SGLang's pack: sglang-kernel's FlashAttention 3 library (1,070 MiB; 326 MiB deflated in the wheel) travels
zstd-compressed beside the wheel (ZST: 150 MiB), and device.sh puts it back in place after the install, its sha256
checked; the tokenizer source of the random-weight folders (.ci-work/device/tiny-gpu.gguf, 5.5 MB) travels inside.

1. ``pip download --no-deps --require-hashes -r wheels.txt`` into $VLLM_GPU_WHEELS
   (/tmp/vllm_gpu_wheels: never the repo); pip checks every sha256 that resolve.py recorded.
2. Trims the vLLM wheel (TRIM: kernels this H200 run never loads, 144 MiB of its 290) into
   ``vllm-0.26.0-...whl`` under .ci-work/vllm_gpu/build/ with its RECORD rewritten; the PyPI
   sha256 of the original and the sha256 of the trimmed file are both in the manifest.
3. Writes one uncompressed tar of every file (``payload/``: wheels, ``checks.json`` for the
   device packages whose version is unknown, the GGUF, ``MANIFEST.sha256``) and splits it into
   parts of at most --part-mib (default: 64 MiB less the working tree that travels with every
   call, less 2 MiB), each in a folder of its own, ``.ci-work/vllm_gpu/partK/`` (git-ignored:
   /.ci-work/ in .gitignore), beside ``parts.sha256`` (every part's sha256, copied into each
   folder so any one call can check what it carries).
4. Prints the device calls (commands and carry lists) for the coordinator.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WORK = ROOT / ".ci-work" / "vllm_gpu"
WHEELS = Path(os.environ.get("VLLM_GPU_WHEELS", "/tmp/vllm_gpu_wheels"))
ENGINE = "vllm"
MiB = 1 << 20
LIMIT = 64 * MiB              # what one device call carries, the working tree included
MARGIN = 2 * MiB
# Members of wheels left out (compressed MiB in the wheel): each is loaded only on a path this
# run does not take (checked in vLLM's source; README.md says how).
TRIM: dict[str, tuple[str, ...]] = {
    "vllm": (
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",   # 123.5: FlashAttention 2; on SM90 vLLM picks FA3
                                                      # (fa_utils.get_flash_attn_version); FA2's import is
                                                      # guarded (FA2_AVAILABLE = False)
        "vllm/vllm-rs",                               # 14.9: the opt-in Rust frontend (VLLM_USE_RUST_FRONTEND=1)
        "vllm/third_party/fmha_sm100/",               # 3.8: Blackwell (SM100) attention for MiniMax-M3 only
        "vllm/third_party/deep_gemm/_C.cpython-310",  # 0.5 each: DeepGEMM for the other Pythons
        "vllm/third_party/deep_gemm/_C.cpython-311",  # (the device's is 3.12: its _C.cpython-312 stays)
        "vllm/third_party/deep_gemm/_C.cpython-313",
        "vllm/third_party/deep_gemm/_C.cpython-314",
    ),
    # 30.0: the static C++ library for programs that link xgrammar; Python loads libxgrammar_bindings.so
    "xgrammar": ("xgrammar/lib/",),
}
TRIM_SGLANG: dict[str, tuple[str, ...]] = {
    # 15.0: the SM100+ build of the common ops; load_utils picks sm90/ on compute capability 9.0
    "sglang-kernel": ("sgl_kernel/sm100/", "sgl_kernel/flash_ops.abi3.so"),   # flash_ops: ZST below
    "xgrammar": ("xgrammar/lib/",),
}
# wheel members that travel zstd-compressed (level 12, 128 MiB window) beside their trimmed wheel
ZST: dict[str, tuple[str, ...]] = {"sglang-kernel": ("sgl_kernel/flash_ops.abi3.so",)}
TOKENIZER_GGUF = ROOT / ".ci-work" / "device" / "tiny-gpu.gguf"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(MiB), b""):
            h.update(block)
    return h.hexdigest()


def download(req: Path) -> None:
    WHEELS.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PIP_CONSTRAINT": "", "PIP_FIND_LINKS": ""}   # this machine's local caps/folders
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3", "--abi", "none",
           *[a for n in range(34, 16, -1) for a in ("--platform", f"manylinux_2_{n}_x86_64")],
           "--platform", "manylinux2014_x86_64", "--platform", "manylinux1_x86_64", "--platform", "linux_x86_64",
           "-d", str(WHEELS), "-r", str(req)]
    subprocess.run(cmd, check=True, env=env)


def trim(src: Path, dst: Path, drop: tuple[str, ...]) -> dict:
    """Copy the wheel without the members under ``drop``, RECORD rewritten to match."""
    dropped: list[tuple[str, int]] = []
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        record = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        for info in zin.infolist():
            if info.filename.startswith(drop):
                dropped.append((info.filename, info.compress_size))
                continue
            if info.filename == record:
                continue
            zout.writestr(info, zin.read(info.filename), compress_type=info.compress_type)
        kept = [line for line in zin.read(record).decode().splitlines() if not line.split(",", 1)[0].startswith(drop)]
        zout.writestr(zin.getinfo(record), "\n".join(kept) + "\n")   # the original's date: a reproducible file
    counts = {prefix: sum(1 for name, _ in dropped if name.startswith(prefix)) for prefix in drop}
    return {"dropped_files": counts, "dropped_mib": round(sum(s for _, s in dropped) / MiB, 1)}


def compress_member(wheel: Path, member: str, dst: Path) -> dict:
    """``member`` of ``wheel`` as a zstd file (the zstd command: level 12, a 128 MiB window, both cores)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    raw = dst.with_suffix("")
    with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(raw, "wb") as out:
        shutil.copyfileobj(src, out, MiB)
    member_sha, member_size = sha256(raw), raw.stat().st_size
    subprocess.run(["zstd", "-q", "-f", "-T2", "-12", "--long=27", str(raw), "-o", str(dst)], check=True)
    raw.unlink()
    return {"kind": "member.zst", "member": member, "member_sha256": member_sha, "member_size": member_size}


def travelling_tree_bytes() -> int:
    """Tracked + untracked-not-ignored files: what travels with every call besides the carry."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, check=True).stdout
    total = 0
    for name in out.split(b"\0"):
        p = ROOT / os.fsdecode(name)
        if name and p.is_file():
            total += p.stat().st_size
    return total


def find_gguf() -> Path | None:
    for p in (Path(os.environ["VLLM_GPU_GGUF"]) if os.environ.get("VLLM_GPU_GGUF") else None,
              Path.home() / ".cache/engineroom/models/smollm2-135m" / GGUF_NAME):
        if p is not None and p.is_file():
            return p
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part-mib", type=float, default=None)
    ap.add_argument("--no-gguf", action="store_true", help="leave SmolLM2's GGUF out (the dummy-weight models only)")
    ap.add_argument("--skip-download", action="store_true")
    ap.add_argument("--engine", choices=("vllm", "sglang"), default="vllm")
    args = ap.parse_args()
    global WORK, WHEELS, ENGINE
    ENGINE = args.engine
    trims = TRIM if ENGINE == "vllm" else TRIM_SGLANG
    zst = {} if ENGINE == "vllm" else ZST
    stem = "wheels" if ENGINE == "vllm" else f"wheels-{ENGINE}"
    if ENGINE != "vllm":
        WORK = ROOT / ".ci-work" / f"{ENGINE}_gpu"
        WHEELS = Path(os.environ.get(f"{ENGINE.upper()}_GPU_WHEELS", f"/tmp/{ENGINE}_gpu_wheels"))
        args.no_gguf = True
    resolved = json.loads((HERE / f"{stem}.json").read_text())
    pkgs = resolved["packages"]
    if not args.skip_download:
        download(HERE / f"{stem}.txt")
    shutil.rmtree(WORK, ignore_errors=True)
    payload = WORK / "build" / "payload"
    payload.mkdir(parents=True)
    manifest: dict[str, dict] = {}
    checks = []
    for p in pkgs:
        if p["decision"] == "carry":
            src = WHEELS / p["filename"]
            if sha256(src) != p["sha256"]:
                print(f"{src.name}: sha256 differs from wheels.json", file=sys.stderr)
                return 1
            dst = payload / "wheels" / src.name
            dst.parent.mkdir(exist_ok=True)
            entry: dict = {"kind": "wheel", "name": p["name"], "version": p["version"], "pypi_sha256": p["sha256"]}
            if p["name"] in trims:
                entry.update(trim(src, dst, trims[p["name"]]))
                entry["pypi_size"] = p["size"]
                for member in zst.get(p["name"], ()):
                    manifest[f"zst/{member}.zst"] = compress_member(src, member, payload / "zst" / f"{member}.zst")
            else:
                shutil.copy2(src, dst)
            manifest[f"wheels/{src.name}"] = entry
        if "fallback" in p:
            src = WHEELS / p["fallback"]["filename"]
            if sha256(src) != p["fallback"]["sha256"]:
                print(f"{src.name}: sha256 differs from wheels.json", file=sys.stderr)
                return 1
            dst = payload / "fallback" / src.name
            dst.parent.mkdir(exist_ok=True)
            shutil.copy2(src, dst)
            manifest[f"fallback/{src.name}"] = {"kind": "fallback", "name": p["name"],
                                                "pypi_sha256": p["fallback"]["sha256"]}
        if p["decision"] == "device" and p["spec"]:
            checks.append({"name": p["name"], "spec": p["spec"], "fallback": (p.get("fallback") or {}).get("filename")})
    (payload / "checks.json").write_text(json.dumps(checks, indent=1) + "\n")
    if ENGINE != "vllm":
        if not TOKENIZER_GGUF.is_file():
            print(f"{TOKENIZER_GGUF} is missing: the random-weight folders' tokenizer source", file=sys.stderr)
            return 1
        (payload / "models").mkdir()
        shutil.copy2(TOKENIZER_GGUF, payload / "models" / TOKENIZER_GGUF.name)
        manifest[f"models/{TOKENIZER_GGUF.name}"] = {"kind": "tokenizer-gguf"}
    gguf = None if args.no_gguf else find_gguf()
    if not args.no_gguf and gguf is None:
        print(f"{GGUF_NAME} not found: run `engineroom models pull smollm2-135m` (or set VLLM_GPU_GGUF), "
              "or pass --no-gguf", file=sys.stderr)
        return 1
    if gguf is not None:
        (payload / "models").mkdir()
        with open(gguf, "rb") as src_fh, gzip.open(payload / "models" / (GGUF_NAME + ".gz"), "wb", 6) as gz:
            shutil.copyfileobj(src_fh, gz)      # 98.4 -> 92.7 MB: one part fewer
        manifest[f"models/{GGUF_NAME}.gz"] = {"kind": "gguf.gz", "gguf_sha256": sha256(gguf),
                                              "gguf_size": gguf.stat().st_size}
    for rel, entry in manifest.items():
        entry["sha256"] = sha256(payload / rel)
        entry["size"] = (payload / rel).stat().st_size
    (payload / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    (payload / "MANIFEST.sha256").write_text("".join(f"{e['sha256']}  {rel}\n" for rel, e in sorted(manifest.items())))
    bundle = WORK / "build" / "payload.tar"
    with tarfile.open(bundle, "w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(payload, arcname="payload")
    tree = travelling_tree_bytes()
    part = int((args.part_mib * MiB) if args.part_mib else min(60 * MiB, LIMIT - tree - MARGIN))
    size = bundle.stat().st_size
    n = math.ceil(size / part)
    digests = []
    with open(bundle, "rb") as fh:
        for k in range(1, n + 1):
            d = WORK / f"part{k}"
            d.mkdir()
            data = fh.read(part)
            (d / f"part{k}.bin").write_bytes(data)
            digests.append(f"{hashlib.sha256(data).hexdigest()}  part{k}.bin")
    listing = "".join(line + "\n" for line in digests) + f"# bundle {sha256(bundle)} {size} bytes {n} parts\n"
    for k in range(1, n + 1):
        (WORK / f"part{k}" / "parts.sha256").write_text(listing)
    shutil.rmtree(WORK / "build")
    keys = ("dropped_files", "dropped_mib", "pypi_sha256", "sha256", "size")
    summary = {"bundle_bytes": size, "parts": n, "part_bytes": part, "tree_bytes": tree,
               "files": len(manifest),
               "trimmed": {e["name"]: {k: e[k] for k in keys} for e in manifest.values() if "dropped_mib" in e}}
    (WORK / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"bundle {size / MiB:.1f} MiB ({len(manifest)} files) in {n} parts of <= {part / MiB:.1f} MiB; "
          f"the working tree that travels with each call: {tree / MiB:.1f} MiB")
    print("\nDevice calls (one lease: each call right after the last; the machine is given back 30 s after a call):")
    env = "" if ENGINE == "vllm" else f"ENGINE={ENGINE} "
    for k in range(1, n + 1):
        last = f" && {env}SMOKE=0 bash benchmarks/vllm_gpu/device.sh install" if k == n else ""
        print(f"  {k}. command: {env}bash benchmarks/vllm_gpu/device.sh recv {k}{last}\n"
              f"     carry: [\".ci-work/{WORK.name}/part{k}\"]")
    if ENGINE != "vllm":
        print(f"  {n + 1}. command: bash benchmarks/vllm_gpu/try_sglang.sh smollm2 ; then qwen36-27b")
        return 0
    print(f"  {n + 1}. command: bash benchmarks/vllm_gpu/run_gpu.sh smollm2      carry: []")
    print(f"  {n + 2}. command: bash benchmarks/vllm_gpu/run_gpu.sh qwen36-27b   carry: []")
    print(f"  {n + 3}. command: bash benchmarks/vllm_gpu/run_gpu.sh qwen36-35b-a3b  carry: []  (if the budget allows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
