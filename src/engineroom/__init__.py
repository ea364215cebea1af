"""engineroom: which engine, which quant, which flags, how much context, how fast — on my hardware."""

__version__ = "0.1.0"
