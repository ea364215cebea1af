"""Before an engine is installed: can it serve on this machine at all?

An install is minutes and gigabytes (SGLang: about 6 minutes and 11 GB of torch with its CUDA
wheels); an engine whose catalog entry names no build for this machine's accelerator (SGLang
serves on NVIDIA and AMD GPUs only, and its server exits at start on a CPU-only machine) is
said to be so before anything is downloaded. ``engines install`` then stops unless ``--force``
is given — an install that cannot serve still has a use: its own argument parser checks the
command lines ``recipe`` and ``up`` render for the machines that do serve it.
"""

from __future__ import annotations

from .. import engines


def serve_refusal(engine: str) -> str | None:
    """Why ``engine`` cannot serve on this machine (one sentence, with what the install costs), or
    None when its catalog entry has a build for this machine's accelerator (or has no entry)."""
    from ..catalog import load_catalog
    from ..hardware import detect_rig

    entry = load_catalog().engine(engine)
    if entry is None or not entry.vendors:
        return None
    rig = detect_rig()
    here = rig.vendor
    if here in entry.vendors:
        return None
    what = "a CPU-only machine (no GPU found)" if here == "cpu" else f"a machine with {here} accelerators"
    cost = ""
    if engines.has_adapter(engine):
        expected = getattr(engines.adapter(engine).impl, "EXPECTED_BUILD", "")
        cost = f" The install takes {expected}." if expected else ""
    return (f"{entry.name} cannot serve on this machine: it runs on {' and '.join(entry.vendors)} GPUs and this is "
            f"{what}, so its server would exit at start.{cost}")


__all__ = ["serve_refusal"]
