"""The engine adapter seam.

CONTRACT used by launch, checks, bench and flows:

- ``LaunchSpec``: everything needed to start an engine (argv, env, port, log path).
- ``ServerInfo``: what a running OpenAI-compatible server told us about itself (engine,
  version, model id, declared capabilities). Checks and bench receive a ServerInfo; they
  never import an adapter or the launcher.
- ``Capabilities``: declared by the server itself (llama.cpp: ``/props``
  chat_template_caps). ``None`` means "the server does not say"; ``False`` means it
  declares the feature absent (the only case in which a check may SKIP).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


UNKNOWN_FAILURE = "unknown (see the log lines above)"   # what classify_failure says when no pattern matched


@dataclass(frozen=True)
class LaunchSpec:
    engine: str
    argv: tuple[str, ...]
    port: int
    host: str = "127.0.0.1"
    env: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    model: str = ""                   # the model reference as the user gave it
    model_path: str = ""              # resolved file / dir
    health_path: str = "/health"
    engine_version: str = ""          # what the binary says of itself (`--version`)
    changes: tuple[dict, ...] = ()    # arguments engineroom added for this machine: {args, why, source}

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass(frozen=True)
class Capabilities:
    tools: bool | None = None              # template/parser can emit tool calls
    tool_choice_required: bool | None = None
    parallel_tool_calls: bool | None = None
    json_schema: bool | None = None        # response_format json_schema
    reasoning: bool | None = None
    vision: bool | None = None
    timings: bool | None = None            # per-response engine timings
    ignore_eos: bool | None = None         # accepts ignore_eos to reach a requested length
    reasons: dict[str, str] = field(default_factory=dict)  # capability -> where we learnt it


@dataclass(frozen=True)
class ServerInfo:
    url: str
    engine: str                 # "llama.cpp", "vllm", ... or "unknown"
    engine_version: str = ""
    model_id: str = ""          # first id of /v1/models
    n_ctx: int | None = None
    total_slots: int | None = None
    capabilities: Capabilities = field(default_factory=Capabilities)
    chat_template: str | None = None
    extra: dict[str, object] = field(default_factory=dict)
