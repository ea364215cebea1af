"""What ``serving.prepare`` resolved for a launch, checked before anything is stopped or started.

A record of its own so that what reads a prepared launch (``validation``: the engine's own parser on its
command lines; ``docker``; ``switching``) does not import ``serving``, which chains prepare, that check
and the launch (``serving.start``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .. import apikey
    from ..engines.base import LaunchSpec
    from ..launchargs import LaunchArgs
    from ..plan.request import LaunchRequest
    from .picks import Pick
    from .prediction import Prediction


@dataclass(frozen=True)
class Prepared:
    """Everything checked before anything is stopped or started (``switch`` relies on that)."""

    spec: LaunchSpec                 # the adapter's LaunchSpec
    args: LaunchArgs                 # the arguments as given, the pick's settings filled in (kept for `switch`)
    prediction: Prediction | None = None
    pick: Pick | None = None
    binary_found: bool = True        # False: a recipe rendered without the engine installed
    key: apikey.LaunchKey | None = None   # the launch's API key: references, and the file the engine reads
    cluster: tuple[LaunchSpec, ...] = ()  # a pick spanning machines: one command per node, rank order
    request: LaunchRequest | None = None  # what was rendered: the pick's request with the typed options
