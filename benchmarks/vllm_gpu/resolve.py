#!/usr/bin/env python3
"""Which wheels vLLM's (or SGLang's) CUDA build needs beside what the lent GPU machine already has.

    .venv/bin/python benchmarks/vllm_gpu/resolve.py [--engine vllm --version 0.26.0]   # -> wheels.json, wheels.txt
    .venv/bin/python benchmarks/vllm_gpu/resolve.py --engine sglang                   # -> wheels-sglang.json, .txt

SGLang 0.5.16 is the newest release that pins the device's PyTorch (2.11.0; 0.5.18 and later pin 2.13).

Reads package metadata from PyPI's JSON API (one request per package, plus one per chosen
version for its Requires-Dist; no wheel is downloaded: this workplace's index serves no PEP 658
metadata files, so ``pip install --dry-run`` downloads every wheel it resolves, 300 MB for vLLM
alone). Starting from vLLM's own requirements (markers evaluated for CPython 3.12 on
x86_64 Linux, no extras), a requirement is

- ``device``: the machine has the package (``DEVICE`` below, from the device docs' package list;
  where a version is known it must satisfy the specifier, else it is checked on the device by
  ``device.sh check``);
- ``skip``: left out on purpose (``SKIP``: optional kernels or features vLLM imports lazily;
  the serve path avoids them with the settings in ``run_gpu.sh``);
- ``carry``: resolved to the newest version with a wheel for cp312 / manylinux x86_64 that
  satisfies every requirer's specifier, and its own requirements followed the same way.

Writes ``wheels.json`` (every decision, with size, sha256 and the requirer) and ``wheels.txt``
(``name==version --hash=sha256:...`` lines for ``pip download --require-hashes``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from engineroom.pypi import PYPI_JSON

HERE = Path(__file__).resolve().parent
PYPI = PYPI_JSON.split("/{package}")[0]          # the project's one PyPI address (engineroom.pypi)
WHEELS = Path(os.environ.get("VLLM_GPU_WHEELS", "/tmp/vllm_gpu_wheels"))   # download.sh's folder

# The image's packages (/work/.library/device/KINDS.md, "Python packages already there", read
# 2026-11-17) with the versions its pip-list row gives; None: present, version not stated.
DEVICE: dict[str, str | None] = dict.fromkeys("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl
zipp""".split())
DEVICE.update({"accelerate": "1.15.0", "huggingface-hub": "1.33.0", "numpy": "2.5.2", "safetensors": "0.8.0",
               "sentencepiece": "0.2.2", "tiktoken": "0.14.0", "tokenizers": "0.23.2", "torch": "2.11.0",
               "torchaudio": "2.11.0", "torchvision": "0.26.0", "transformers": "5.17.0", "triton": "3.6.0",
               "onnx": "1.23.1", "cupy-cuda13x": "14.2.0"})

# Left out (why). Each is imported lazily by vLLM 0.26.0 (checked in its source: no module on the
# text-serving path imports it at top level), or is reached only through a setting run_gpu.sh avoids.
SKIP: dict[str, str] = {
    "flashinfer-python": "JIT kernels (sampler, GDN prefill on SM90, MoE/attention backends); avoided with "
                         "VLLM_USE_FLASHINFER_SAMPLER=0 and --gdn-prefill-backend triton; attention is FA3",
    "flashinfer-cubin": "flashinfer's prebuilt kernels",
    "nvidia-cutlass-dsl": "CuTe DSL kernels (FA4, Blackwell paths, cutedsl GDN): not on the SM90 FA3 path",
    "quack-kernels": "CuTe DSL kernels (cutedsl GDN prefill, DSA indexer): opt-in only",
    "tilelang": "TileLang kernels (has_tilelang() guard)",
    "tokenspeed-mla": "MLA kernels (DeepSeek-style models)",
    "humming-kernels": "quantized GEMM kernels (has_humming() guard)",
    "torchcodec": "video/audio decoding (multimodal inputs)",
    "pynvvideocodec": "video decoding (multimodal inputs)",
    "nvidia-cudnn-frontend": "cuDNN attention paths (not selected on SM90 for these models)",
    "nvtx": "profiling ranges (only with the profiler on)",
    "fastsafetensors": "an alternative weight loader (--load-format fastsafetensors)",
    "numba": "ngram speculative decoding only; the image has numba (vLLM pins 0.65.0)",
    "opentelemetry-sdk": "tracing (--otlp-traces-endpoint)",
    "opentelemetry-api": "tracing (--otlp-traces-endpoint)",
    "opentelemetry-exporter-otlp": "tracing (--otlp-traces-endpoint)",
    "opentelemetry-semantic-conventions-ai": "tracing (--otlp-traces-endpoint)",
    "mcp": "the tool server of the Responses API (--tool-server)",
    "lm-format-enforcer": "a structured-output backend chosen only by name",
    "outlines-core": "a structured-output backend chosen only by name",
    "lark": "the outlines backend's grammar parser",
    "depyf": "torch.compile debug dumps only",
    "python-json-logger": "a JSON logging config only when one is given",
    "mistral-common": "Mistral tokenizers / tool parser (imported only for tokenizer_mode mistral)",
    "fastapi-cli": "fastapi[standard]'s CLI (vLLM runs uvicorn itself)",
    "fastapi-cloud-cli": "fastapi[standard]'s cloud CLI",
    "email-validator": "fastapi[standard] extra; vLLM's models use no EmailStr",
}
# Left out of SGLang 0.5.16's requirements (why): each is imported lazily on its text-serving path (a
# guarded import or a module loaded only for the feature named; checked in its source), or serves
# another GPU generation; what a skip costs shows as an import error in device.sh's import check.
SKIP_SGLANG: dict[str, str] = {
    "flash-attn-4": "FlashAttention 4 (Blackwell); SM90 attention is FA3, from sglang-kernel",
    "nvidia-cutlass-dsl": "CuTe DSL kernels (FA4, quack, Blackwell MoE): not on the SM90 path",
    "nvidia-mathdx": "cuBLASDx/cuFFTDx headers for JIT kernels of other paths",
    "quack-kernels": "CuTe DSL kernels (opt-in)",
    "tilelang": "TileLang kernels (DeepSeek sparse attention)",
    "tokenspeed-mla": "MLA kernels (DeepSeek-style models)",
    "humming-kernels": "quantized GEMM kernels (opt-in backend)",
    "helion": "Helion kernels (opt-in)",
    "kernels": "Hugging Face's kernel hub (downloads kernels at run time; the device reaches no hub)",
    "sgl-deep-gemm": "DeepGEMM (FP8 block GEMM; these picks are 16-bit or int4)",
    "torchcodec": "video/audio decoding (multimodal inputs)",
    "torchao": "torchao quantization (--torchao-config only)",
    "datasets": "sglang.bench_serving's datasets only",
    "modelscope": "ModelScope downloads (SGLANG_USE_MODELSCOPE only)",
    "py-spy": "the watchdog's stack dumps",
    "timm": "vision towers of other models",
    "smg-grpc-servicer": "the gRPC server mode",
    "outlines": "a grammar backend chosen only by name (the default is xgrammar)",
    "mistral-common": "Mistral tokenizers (tokenizer_mode mistral)",
    "flashinfer-cubin": "FlashInfer's prebuilt kernels",
    "nvidia-cudnn-frontend": "cuDNN attention paths (FlashInfer imports it lazily)",
    "uv": "engineroom's engine installer (engines install): not run on the device",
}
# the requirements of each engine's run beyond its own: the root, the skips, the extras
# (vLLM: fastapi[standard]'s extras it does use: uvicorn runs the server; forms need python-multipart)
ENGINES: dict[str, dict] = {
    "vllm": {"version": "0.26.0", "skip": SKIP, "extra": ("uvicorn>=0.30", "python-multipart>=0.0.9"),
             "out": "wheels.json"},
    # own: packages the device has at a version the engine's pins refuse: the engine's own is carried and
    # shadows the device's in its venv (SGLang 0.5.16 pins transformers 5.12.1; the device has 5.17.0)
    # (SGLang: flashinfer-python is imported by its sampler on CUDA whatever the backend; IPython by sglang.utils,
    # soundfile by the server's transcription routes, dill by custom logit processors: all at module level,
    # found by importing sglang.launch_server, its http_server, scheduler and model runner on this machine)
    "sglang": {"version": "0.5.16", "skip": SKIP_SGLANG, "extra": ("dill",), "out": "wheels-sglang.json",
               "own": ("transformers", "tokenizers")},   # transformers 5.12.1: tokenizers<=0.23.0 (device: 0.23.2)
}
ENGINE = "vllm"
# packages the image has whose version is not stated: no fallback wheel for these (too large, or
# pinned by the image's torch build); every other such package gets the newest wheel that meets the
# specifier, installed on the device only when its own version does not (device.sh install)
NO_FALLBACK = {"opencv-python-headless", "protobuf", "pillow", "numpy", "torch", "triton", "transformers",
               "torchvision",
               "torchaudio", "aiohttp", "regex", "psutil", "pyyaml", "ninja", "cmake", "nvidia-ml-py",
               "uvloop"}  # uvloop: >=0.15.1 (2021) is asked, 4 MiB

TAGS: set[Tag] = set()
CUTOFF = ""      # ISO time: only releases uploaded before it (set from vLLM's own upload, --as-of)


def _tags() -> set[Tag]:
    plats = [f"manylinux_2_{n}_x86_64" for n in range(34, 16, -1)] + ["manylinux2014_x86_64",
                                                                      "manylinux2010_x86_64",
                                                                      "manylinux1_x86_64", "linux_x86_64"]
    tags = set(cpython_tags(python_version=(3, 12), abis=["cp312", "abi3", "none"], platforms=plats))
    tags |= set(compatible_tags(python_version=(3, 12), interpreter="cp312", platforms=plats))
    return tags


def _env() -> dict[str, str]:
    env = default_environment()
    env.update({"python_version": "3.12", "python_full_version": "3.12.3", "implementation_name": "cpython",
                "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
                "platform_machine": "x86_64", "os_name": "posix"})
    return env


_CACHE: dict[str, dict] = {}


def _get(url: str) -> dict:
    if url not in _CACHE:
        with urllib.request.urlopen(url, timeout=60) as resp:
            _CACHE[url] = json.load(resp)
    return _CACHE[url]


def _wheel(name: str, spec: SpecifierSet, pinned: dict[str, str] | None = None) -> tuple[str, dict] | None:
    """(version, file) of the newest release satisfying ``spec`` with a wheel for the device,
    uploaded before CUTOFF, whose own requirements accept every version in ``pinned``."""
    data = _get(f"{PYPI}/{name}/json")
    versions = sorted((Version(v) for v in data["releases"] if _valid(v)), reverse=True)
    for v in versions:
        if v.is_prerelease or not spec.contains(v, prereleases=False):
            continue
        files = [f for f in data["releases"][str(v)] if f["filename"].endswith(".whl") and not f.get("yanked")]
        if CUTOFF and files and min(f["upload_time"] for f in files) > CUTOFF:
            continue
        best = None
        for f in files:
            try:
                _n, _v, _b, ftags = parse_wheel_filename(f["filename"])
            except ValueError:
                continue
            if ftags & TAGS:
                best = f
                if "manylinux" in f["filename"] or "none-any" in f["filename"]:
                    break
        if best is None:
            continue
        if pinned and _conflict(_requires(name, str(v), best), pinned):
            continue
        return str(v), best
    return None


def _conflict(requires: list[str], pinned: dict[str, str]) -> str | None:
    """The first requirement that a version already chosen (or the device's) does not meet."""
    env = _env()
    for dep in requires:
        d = Requirement(dep)
        if d.marker is not None and not d.marker.evaluate({**env, "extra": ""}):
            continue
        have = pinned.get(canonicalize_name(d.name))
        if have is not None and not d.specifier.contains(Version(have), prereleases=True):
            return dep
    return None


def _requires(name: str, version: str, f: dict) -> list[str]:
    """Requires-Dist of ``name==version``: the project JSON's when it is the latest release (this
    index serves no per-version JSON), else read from the wheel itself, downloaded into WHEELS
    (it is one that gets carried, so download.sh finds it there) and checked against its sha256."""
    info = _get(f"{PYPI}/{name}/json")["info"]
    if info["version"] == version:
        return list(info.get("requires_dist") or [])
    WHEELS.mkdir(parents=True, exist_ok=True)
    path = WHEELS / f["filename"]
    if not (path.is_file() and _sha256(path) == f["digests"]["sha256"]):
        tmp = path.with_suffix(".part")
        with urllib.request.urlopen(_url(name, f), timeout=300) as resp, open(tmp, "wb") as out:
            shutil.copyfileobj(resp, out)
        if _sha256(tmp) != f["digests"]["sha256"]:
            raise SystemExit(f"{f['filename']}: sha256 differs from the index's")
        tmp.rename(path)
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def _url(name: str, f: dict) -> str:
    return urllib.parse.urljoin(f"{PYPI}/{name}/json", f["url"])


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _valid(v: str) -> bool:
    try:
        Version(v)
        return True
    except ValueError:
        return False


def resolve(version: str) -> dict:
    env = _env()
    skip = ENGINES[ENGINE]["skip"]
    for name in ENGINES[ENGINE].get("own", ()):
        DEVICE.pop(name, None)
        NO_FALLBACK.discard(name)
    roots = [Requirement(f"{ENGINE}=={version}"), *(Requirement(r) for r in ENGINES[ENGINE]["extra"])]
    engineroom = [Requirement(r) for r in _engineroom_requirements()]
    specs: dict[str, SpecifierSet] = {}
    why: dict[str, list[str]] = {}
    chosen: dict[str, dict] = {}
    decisions: dict[str, dict] = {}
    queue = [(r, "(root)") for r in roots] + [(r, "engineroom") for r in engineroom]
    while queue:
        req, parent = queue.pop(0)
        if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
            continue
        name = canonicalize_name(req.name)
        why.setdefault(name, []).append(f"{parent}: {req}")
        specs[name] = specs.get(name, SpecifierSet()) & req.specifier
        if name in skip and name != ENGINE:
            decisions[name] = {"name": name, "decision": "skip", "why": skip[name], "required_by": why[name]}
            continue
        if name in DEVICE:
            have = DEVICE[name]
            ok = None if have is None else specs[name].contains(Version(have), prereleases=True)
            decisions[name] = {"name": name, "decision": "device", "device_version": have,
                               "spec": str(specs[name]), "satisfied": ok, "required_by": why[name]}
            continue
        prev = chosen.get(name)
        if prev is not None and specs[name].contains(Version(prev["version"]), prereleases=True) \
                and not req.extras - set(prev["extras"]):
            continue
        pinned = {n: c["version"] for n, c in chosen.items()}
        pinned.update({n: v for n, v in DEVICE.items() if v is not None})
        pinned.update({n: str(next(iter(sp)).version) for n, sp in specs.items()
                       if len(sp) == 1 and next(iter(sp)).operator == "=="})
        pinned.pop(name, None)
        found = _wheel(name, specs[name], pinned)
        if found is None:
            decisions[name] = {"name": name, "decision": "missing", "spec": str(specs[name]), "required_by": why[name]}
            continue
        version, f = found
        extras = sorted(set(req.extras) | set(prev["extras"] if prev else []))
        chosen[name] = {"version": version, "extras": extras}
        requires = _requires(name, version, f)
        decisions[name] = {"name": name, "decision": "carry", "version": version, "extras": extras,
                           "filename": f["filename"], "size": f["size"], "sha256": f["digests"]["sha256"],
 "spec": str(specs[name]), "required_by": why[name]}
        for dep in requires:
            d = Requirement(dep)
            if d.marker is not None:
                if not any(d.marker.evaluate({**env, "extra": e}) for e in ["", *extras]):
                    continue
                d.marker = None
            queue.append((d, f"{name}=={version}"))
    for d in decisions.values():
        if d["decision"] == "device" and d["device_version"] is None and d["spec"] and d["name"] not in NO_FALLBACK:
            found = _wheel(d["name"], SpecifierSet(d["spec"]))
            if found is not None:
                version, f = found
                d["fallback"] = {"version": version, "filename": f["filename"], "size": f["size"],
                                 "sha256": f["digests"]["sha256"]}
    return {ENGINE: version, "python": "cp312", "released_before": CUTOFF,
            "platform": "manylinux_2_17..2_34 x86_64",
            "packages": sorted(decisions.values(), key=lambda d: (d["decision"], d["name"]))}


def _engineroom_requirements() -> list[str]:
    """engineroom's own runtime dependencies (pyproject.toml): it runs on the device beside vLLM."""
    import tomllib

    data = tomllib.loads((HERE.parents[1] / "pyproject.toml").read_text())
    return list(data["project"]["dependencies"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=sorted(ENGINES), default="vllm")
    ap.add_argument("--version", default=None, help="the engine's release (default: vLLM 0.26.0, SGLang 0.5.16)")
    ap.add_argument("--out", type=Path, default=None, help="default: wheels.json (vLLM), wheels-sglang.json")
    ap.add_argument("--as-of", default=None, help="ISO date: newest releases before it (default: 7 days after "
                    "the engine's own upload, the dependency set its release was tested against)")
    args = ap.parse_args()
    TAGS.update(_tags())
    global CUTOFF, ENGINE
    ENGINE = args.engine
    args.version = args.version or ENGINES[ENGINE]["version"]
    args.out = args.out or HERE / ENGINES[ENGINE]["out"]
    if args.as_of:
        CUTOFF = args.as_of
    else:
        import datetime

        files = _get(f"{PYPI}/{ENGINE}/json")["releases"][args.version]
        uploaded = datetime.datetime.fromisoformat(min(f["upload_time"] for f in files))
        CUTOFF = (uploaded + datetime.timedelta(days=7)).isoformat()
    result = resolve(args.version)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    carry = [p for p in result["packages"] if p["decision"] == "carry"]
    lines = [f"{p['name']}=={p['version']} --hash=sha256:{p['sha256']}" for p in carry]
    fallbacks = [p for p in result["packages"] if "fallback" in p]
    lines += [f"{p['name']}=={p['fallback']['version']} --hash=sha256:{p['fallback']['sha256']}" for p in fallbacks]
    args.out.with_suffix(".txt").write_text("\n".join(lines) + "\n")
    for kind in ("carry", "device", "skip", "missing"):
        rows = [p for p in result["packages"] if p["decision"] == kind]
        print(f"{kind}: {len(rows)}")
        for p in rows:
            extra = (f"{p['version']} {p['size'] / 2**20:.2f} MiB" if kind == "carry"
                     else f"have {p.get('device_version')} need '{p.get('spec', '')}' ok={p.get('satisfied')}"
                     if kind == "device" else p.get("why", p.get("spec", "")))
            print(f"  {p['name']}: {extra}")
    for p in fallbacks:
        print(f"  fallback {p['name']}=={p['fallback']['version']} ({p['fallback']['size'] / 2**20:.2f} MiB) "
              f"if the device's does not meet '{p['spec']}'")
    total = sum(p["size"] for p in carry) + sum(p["fallback"]["size"] for p in fallbacks)
    print(f"carry total (before trimming): {total / 2**20:.1f} MiB in {len(carry) + len(fallbacks)} wheels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
