"""vLLM across machines: a Ray cluster (head + workers) and one ``vllm`` server on the head.

vLLM's distributed serving (its docs, "Distributed inference and serving"): start Ray on every
node (``ray start --head`` on one, ``ray start --address HEAD:PORT`` on the others), then run
the server once, on the head, with ``--distributed-executor-backend ray``; tensor parallel
within a node and pipeline parallel across nodes (``-tp GPUs per node -pp nodes``) is the
layout it recommends, since TP's all-reduce per layer wants NVLink-class links and PP only
passes activations between stages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ...engines.base import LaunchOptions, LaunchSpec
from ...errors import BadInput
from .command import render
from .discovery import Binary

RAY_PORT = 6379
TP_FLAGS = ("--tensor-parallel-size", "-tp")
PP_FLAGS = ("--pipeline-parallel-size", "-pp")
EXECUTOR_FLAG = "--distributed-executor-backend"


def _has(args: Sequence[str], names: Sequence[str]) -> bool:
    return any(a in names or any(a.startswith(n + "=") for n in names) for a in args)


def _check_head(head_addr: str) -> str:
    host = head_addr.strip()
    if not host or any(c in host for c in " /:"):
        raise BadInput(f"the head address {head_addr!r} must be a host name or IPv4 address without a port "
                       "(Ray's port is given separately).")
    if host in ("localhost", "127.0.0.1", "::1") or host.startswith("127."):
        raise BadInput(f"the head address {head_addr} is this machine's loopback, which the other nodes cannot "
                       "reach; give the head node's address on the cluster network.")
    return host


def render_cluster(binary: Binary, options: LaunchOptions, *, nodes: int, gpus_per_node: int, head_addr: str,
                   ray_port: int = RAY_PORT, pipeline: bool = True) -> list[LaunchSpec]:
    """The commands of one vLLM instance over ``nodes`` machines of ``gpus_per_node`` GPUs, in the
    order to run them: ``ray start --head`` on node 0, ``ray start --address`` on nodes 1..N-1,
    then the server on node 0 (each spec's ``node`` and ``role`` say where and why).

    The hook's engine-neutral signature (SGLang's has the same): ``render_cluster(binary, options,
    *, nodes, gpus_per_node, head_addr, ...) -> list[LaunchSpec]``. ``pipeline`` (default):
    ``-tp gpus_per_node -pp nodes``; otherwise tensor parallel over every GPU. The server's HTTP
    port binds to ``options.host`` (127.0.0.1) as any engineroom launch; Ray's port is the head's.
    """
    if nodes < 1 or gpus_per_node < 1:
        raise BadInput(f"a cluster needs at least one node and one GPU per node (got {nodes} x {gpus_per_node}).")
    if not 1 <= ray_port <= 65535:
        raise BadInput(f"Ray's port must be 1-65535, not {ray_port}.")
    for names in (TP_FLAGS, PP_FLAGS, (EXECUTOR_FLAG,)):
        if _has(options.extra_args, names):
            raise BadInput(f"{names[0]} among the engine arguments conflicts with the cluster recipe, which sets it; "
                           "leave it out.")
    head = _check_head(head_addr)
    tp, pp = (gpus_per_node, nodes) if pipeline else (nodes * gpus_per_node, 1)
    server = render(binary, replace(options, tp=1))
    extra = [*TP_FLAGS[:1], str(tp)] + ([PP_FLAGS[0], str(pp)] if pp > 1 else []) + [EXECUTOR_FLAG, "ray"]
    serve = replace(server, argv=tuple(server.argv) + tuple(extra), node=0, role="serve (after every node joined Ray)")
    ray = str(binary.path.parent / "ray")
    env = {k: v for k, v in server.env.items() if k.startswith(("VLLM_", "HF_", "TRANSFORMERS_", "DO_NOT"))}
    specs = [replace(server, argv=(ray, "start", "--head", f"--port={ray_port}", f"--node-ip-address={head}",
                                   f"--num-gpus={gpus_per_node}"), env=env, node=0, role="ray head")]
    specs += [replace(server, argv=(ray, "start", f"--address={head}:{ray_port}", f"--num-gpus={gpus_per_node}"),
                      env=env, node=rank, role="ray worker") for rank in range(1, nodes)]
    return [*specs, serve]
