"""One model's fits remembered: ``FitMemo.fit(req, rig)`` answers a request it has sized
before from memory. The planner sizes the same (request, rig) many times over (every
priority of a how-to-choose table, the context and concurrency searches); ``fit`` is a pure
function of the model, the request, the rig and the catalog, so the answer cannot change.
"""

from __future__ import annotations

from ..arch import ModelArch
from ..catalog import Catalog
from ..hardware import Rig
from .request import Fit, FitRequest
from .verdict import fit

_EXTRA = list(FitRequest.__dataclass_fields__).index("extra")   # the one dict field


def _req_key(req: FitRequest) -> tuple:
    """The request's field values in order, ``extra`` (a dict) as its sorted pairs."""
    vals = tuple(req.__dict__.values())
    return (*vals[:_EXTRA], tuple(sorted(req.extra.items())), *vals[_EXTRA + 1:])


class FitMemo:
    """``fit`` for one model architecture and catalog, each distinct (request, rig) computed once."""

    def __init__(self, arch: ModelArch, catalog: Catalog | None = None):
        self.arch, self.catalog = arch, catalog
        self._seen: dict[tuple, Fit] = {}
        self.calls = self.computed = 0

    def fit(self, req: FitRequest, rig: Rig) -> Fit:
        self.calls += 1
        key = (_req_key(req), rig)
        got = self._seen.get(key)
        if got is None:
            self.computed += 1
            got = self._seen[key] = fit(self.arch, req, rig, catalog=self.catalog)
        return got

    def __call__(self, arch: ModelArch, req: FitRequest, rig: Rig, *, catalog: Catalog | None = None) -> Fit:
        """``fit``'s own signature: the memo's answer for its model and catalog, else a plain fit."""
        if arch is not self.arch or catalog is not self.catalog:
            return fit(arch, req, rig, catalog=catalog)
        return self.fit(req, rig)
