"""Multi-stage commands: they call the stages in order and hand each what it needs.

``start`` = resolve/pull a model -> find the engine -> render its LaunchSpec -> launch.up.
``connect`` = find out what answers at a URL (engine adapters' probes).
Checks and bench never import the launcher; the flow gives them a ServerInfo.
"""

from __future__ import annotations

from .demo import DemoOutcome, demo
from .docker import ComposeOutcome, DockerServer, compose_recipe, docker_up
from .picks import Pick, launch_options, pick_from_file, pick_from_plan, pick_from_row, pick_of, typed_request
from .prediction import Prediction, predict_memory
from .prepared import Prepared
from .runs import (
    BenchOutcome,
    VerifyOutcome,
    bench,
    bench_suite,
    client_key,
    connect,
    run_conditions,
    verify,
)
from .serving import DEFAULT_PORT, check_ctx, check_port, prepare, record_launch, start, stop
from .stages import StageLog, planned, up
from .switching import switch

__all__ = ["DEFAULT_PORT", "BenchOutcome", "ComposeOutcome", "DemoOutcome", "DockerServer", "Pick",
           "Prediction", "Prepared", "StageLog", "VerifyOutcome", "bench", "bench_suite", "check_ctx", "check_port",
           "client_key",
           "compose_recipe", "connect", "demo", "docker_up", "pick_from_file", "pick_from_plan",
           "pick_from_row", "pick_of", "launch_options", "planned", "typed_request", "predict_memory", "prepare",
           "record_launch", "run_conditions", "start", "stop",
           "switch", "up", "verify"]
