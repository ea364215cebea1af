"""What every catalog schema shares: strict models (unknown keys are errors, values frozen)
and the vocabularies several files use."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

QuantFormat = Literal["gguf", "autoround", "gptq", "awq", "fp8", "nvfp4", "bf16"]
Vendor = Literal["nvidia", "amd", "intel", "apple", "cpu"]


class Strict(BaseModel):
    # defer_build: validators are built at the first validation, not at import; a catalog read
    # back from its cache (catalog/load.py) never validates, so `plan` never pays for them
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
