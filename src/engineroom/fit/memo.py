"""One model's fits remembered: ``FitMemo.fit(req, rig)`` answers a request it has sized
before from memory. The planner sizes the same (request, rig) many times over (every
priority of a how-to-choose table, the context and concurrency searches); ``fit`` is a pure
function of the model, the request, the rig and the catalog, so the answer cannot change.
"""

from __future__ import annotations

from dataclasses import replace

from ..arch import ModelArch
from ..catalog import Catalog
from ..hardware import Rig
from .request import Fit, FitRequest
from .search import max_concurrency, max_context
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
        # rigs by identity -> (the rig, the number of its equal rigs): a Rig's hash walks every field of
        # it and of its GPUs, so each rig object is hashed once, not at every lookup
        self._rig_ids: dict[int, tuple[Rig, int]] = {}
        self._rigs: dict[Rig, int] = {}
        self._searched: dict[tuple, int] = {}     # the searches' answers, by what was searched
        self._relabeled: dict[tuple[int, str], tuple[Fit, Fit]] = {}   # (id(fit), label) -> (fit, its copy)
        self.calls = self.computed = 0

    def rig_key(self, rig: Rig) -> int:
        """A number for ``rig``, the same for every rig equal to it (hashed once per rig object)."""
        known = self._rig_ids.get(id(rig))
        if known is None or known[0] is not rig:
            known = self._rig_ids[id(rig)] = (rig, self._rigs.setdefault(rig, len(self._rigs)))
        return known[1]

    def fit(self, req: FitRequest, rig: Rig) -> Fit:
        self.calls += 1
        key = (_req_key(req), self.rig_key(rig))
        got = self._seen.get(key)
        if got is None:
            self.computed += 1
            got = self._seen[key] = fit(self.arch, req, rig, catalog=self.catalog)
        return got

    def relabeled(self, f: Fit, label: str) -> Fit:
        """``f`` as the fit of an identical group of devices named ``label`` (an instance beside the
        one ``f`` sized), one copy per fit and label."""
        known = self._relabeled.get((id(f), label))
        if known is None or known[0] is not f:
            known = self._relabeled[(id(f), label)] = (f, replace(f, rig_label=label))
        return known[1]

    def max_context(self, req: FitRequest, rig: Rig) -> int:
        """``search.max_context`` over this memo's fits, each distinct search run once."""
        key = ("ctx", _req_key(req), self.rig_key(rig))
        got = self._searched.get(key)
        if got is None:
            got = self._searched[key] = max_context(self.arch, req, rig, catalog=self.catalog, fitter=self)
        return got

    def max_concurrency(self, req: FitRequest, rig: Rig, limit: int) -> int:
        """``search.max_concurrency`` over this memo's fits, each distinct search run once."""
        key = ("parallel", limit, _req_key(req), self.rig_key(rig))
        got = self._searched.get(key)
        if got is None:
            got = self._searched[key] = max_concurrency(self.arch, req, rig, limit=limit, catalog=self.catalog,
                                                        fitter=self)
        return got

    def __call__(self, arch: ModelArch, req: FitRequest, rig: Rig, *, catalog: Catalog | None = None) -> Fit:
        """``fit``'s own signature: the memo's answer for its model and catalog, else a plain fit."""
        if arch is not self.arch or catalog is not self.catalog:
            return fit(arch, req, rig, catalog=catalog)
        return self.fit(req, rig)
