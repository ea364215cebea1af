"""Engine adapters: one module per engine; nothing outside this package branches on an engine's name."""
