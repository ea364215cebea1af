"""The engine's own parser on what a launch, a recipe or a compose file would run.

``check(prepared)`` puts the prepared command line (a cluster's engine commands, one per node)
to the parser of the engine installed on this machine (``engines.argvcheck``); ``require``
is what ``up`` and ``switch`` call before anything starts or stops: a rejected command line
is one sentence and a non-zero exit, nothing launched.
"""

from __future__ import annotations

from .. import apikey, engines
from ..engines.argvcheck import ArgvCheck
from ..errors import BadInput
from .prepared import Prepared


def engine_argvs(prepared: Prepared) -> list[list[str]]:
    """The command lines that run the engine itself: the single command, or each node's command
    that runs the same program as the cluster's last (serving) step (a Ray head or worker runs
    another program and is not the engine's parser's business)."""
    if prepared.cluster:
        program = prepared.cluster[-1].argv[0]
        return [list(s.argv) for s in prepared.cluster if s.argv and s.argv[0] == program]
    return [list(prepared.spec.argv)]


def check(prepared: Prepared) -> ArgvCheck:
    """What the engine installed here says of ``prepared``'s command line(s)."""
    adapter = engines.adapter(prepared.spec.engine)
    return adapter.check_argv(engine_argvs(prepared), prepared.args.engine_bin)


def require(prepared: Prepared) -> ArgvCheck:
    """``check``, raising BadInput (one sentence) when the engine's parser rejects the command line
    (the launch's key file is discarded: nothing starts); otherwise the verdict."""
    verdict = check(prepared)
    if not verdict.ok:
        if prepared.key is not None:
            apikey.discard(prepared.key)     # nothing starts: the launch's key file goes too
        raise BadInput(f"{verdict.line().rstrip('.')}; nothing was started.")
    return verdict


__all__ = ["check", "engine_argvs", "require"]
