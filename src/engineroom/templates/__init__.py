"""Chat templates engineroom ships (Jinja files next to this module).

``smollm2-tools.jinja``: SmolLM2's ChatML plus Hermes-style ``<tool_call>`` JSON calls, so
llama-server (``--chat-template-file``) declares tool support and grammar-constrains
``tool_choice: "required"`` requests for the tiny test model.

``smollm2-think.jinja``: SmolLM2's ChatML with a ``<think>`` block (opened unless
``enable_thinking`` is false, ``reasoning_content`` rendered back), so llama-server's own
reasoning parser splits the output into ``reasoning_content`` and ``content``; launch with
``--reasoning-budget N`` so the engine ends the block (its header says why both are needed).
"""

from __future__ import annotations

from pathlib import Path

TEMPLATES_DIR = Path(__file__).resolve().parent


def template_path(name: str) -> Path:
    """The path of a shipped template, e.g. ``template_path("smollm2-tools.jinja")``."""
    path = TEMPLATES_DIR / name
    if not path.is_file():
        from engineroom.errors import NotFound

        known = ", ".join(sorted(p.name for p in TEMPLATES_DIR.glob("*.jinja")))
        raise NotFound(f"No chat template named {name!r} ships with engineroom (known: {known}).")
    return path
