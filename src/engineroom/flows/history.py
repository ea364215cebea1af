"""What this machine's store says each engine has been through: its latest launch, verify and
bench runs (for `engineroom engines`: "how was it tested" from records, not from claims)."""

from __future__ import annotations

from typing import Any

from ..speedpoints import workload_decode_means
from ..store import Store

KINDS = ("launch", "verify", "bench", "demo")


def _brief(run: dict[str, Any]) -> dict[str, Any]:
    summary = run.get("summary") or {}
    out: dict[str, Any] = {"run": run["id"], "kind": run["kind"], "status": run["status"], "when": run["created"]}
    if run["kind"] == "verify" and isinstance(summary, dict) and "PASS" in summary:
        ran = int(summary.get("PASS") or 0) + int(summary.get("FAIL") or 0)
        out["passed"] = f"{int(summary.get('PASS') or 0)}/{ran}"
    if run["kind"] == "bench" and isinstance(summary, dict):
        rates = workload_decode_means(summary)
        if rates:
            out["decode_tps"] = round(max(rates), 1)
    return out


def engine_history(store: Store | None = None, limit: int = 500) -> dict[str, dict[str, dict[str, Any]]]:
    """{engine: {kind: the newest run of that kind}} over the store's last ``limit`` runs."""
    own = store is None
    st = store or Store()
    try:
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for run in st.runs(limit):                       # newest first
            engine = (run.get("conditions") or {}).get("engine")
            if not isinstance(engine, str) or run["kind"] not in KINDS:
                continue
            out.setdefault(engine, {}).setdefault(run["kind"], _brief(run))
        return out
    finally:
        if own:
            st.close()


__all__ = ["KINDS", "engine_history"]
