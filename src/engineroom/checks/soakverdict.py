"""The soak's verdict (``judge``): pure, over the per-turn records, with the thresholds in ``RULES``."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from engineroom import units
from engineroom.checks.soakrules import RULES, STEPS
from engineroom.records.encoding import ttft_s, wall_s
from engineroom.records.statistics import decode_rate


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of (x, y) points; None with fewer than two distinct x."""
    if len({x for x, _ in points}) < 2:
        return None
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    num = sum((x - mx) * (y - my) for x, y in points)
    den = sum((x - mx) ** 2 for x, _ in points)
    return num / den if den else None


def _mib(n: float | None) -> str:
    return units.mib(n, 1, "n/a")


def _rule(name: str, outcome: str, reason: str, **measured: Any) -> dict[str, Any]:
    return {"rule": name, "outcome": outcome, "reason": reason, "threshold": RULES[name], "measured": measured}


def _memory_bytes(turn: dict[str, Any]) -> int | None:
    mem = turn.get("memory") or {}
    value = mem.get("bytes")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def turn_decode_tps(turn: Mapping[str, Any]) -> float | None:
    """A turn's decode rate: completion tokens / (wall - TTFT), recomputed from its raw arrivals.

    The rate is bench's (``records.statistics.decode_rate``: n/a under 2 tokens or a window under 5% of
    the wall) over the turn's ``arrivals_us`` / ``end_us`` (``records.encoding``' encoding and readers),
    n/a too when the window is under ``RULES["decode_drift"]["min_window_s"]``. A turn that streamed
    only tool-call deltas has no text arrival: its window starts at its recorded ``ttft_s`` (the first
    delta). Records stored before arrivals were kept hold only the rate they computed: read as is."""
    if not isinstance(turn.get("arrivals_us"), list):
        old = turn.get("decode_tps")
        return float(old) if isinstance(old, (int, float)) and not isinstance(old, bool) else None
    tokens = turn.get("completion_tokens")
    first = ttft_s(turn)
    if first is None and isinstance(turn.get("ttft_s"), (int, float)):
        first = float(turn["ttft_s"])
    rate, window, _ = decode_rate(tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None,
                                  wall_s(turn), first)
    if rate is None or window is None or window < RULES["decode_drift"]["min_window_s"]:
        return None
    return rate


def judge(turns: Sequence[dict[str, Any]], memory_source: str | None, *, steps: int = STEPS,
          memory_note: str = "") -> dict[str, Any]:
    """The verdict over the per-turn records: ``{verdict, reason, rules, memory, sessions}``.

    Pure (no server): every rule can be shown to FAIL / WARN from constructed records."""
    rules: list[dict[str, Any]] = []
    sessions: dict[int, list[dict[str, Any]]] = {}
    for t in turns:
        sessions.setdefault(int(t["session"]), []).append(t)
    order = sorted(sessions)
    complete = [i for i in order if len(sessions[i]) >= steps]
    n = len(turns)

    # errors
    errored = [t for t in turns if (t.get("check") or {}).get("status") == "error"]
    if errored:
        first = errored[0]
        before = [t for t in turns if t["session"] == first["session"] and t["turn"] < first["turn"]
                  and isinstance(t.get("prompt_tokens"), int)]
        if isinstance(first.get("prompt_tokens"), int):
            depth = f"{first['prompt_tokens']:,} prompt tokens"
        elif isinstance(first.get("request_chars"), int):
            depth = f"{first['request_chars']:,} chars of conversation" + (
                f", {before[-1]['prompt_tokens']:,} prompt tokens the turn before" if before else "")
        else:
            depth = "depth unknown"
        rules.append(_rule("errors", "FAIL", f"{len(errored)} of {n} turns failed; the first at turn {first['turn']} "
                                             f"(session {first['session']}, {depth}): {first['check']['reason']}",
                           failed=len(errored)))
    else:
        rules.append(_rule("errors", "PASS", f"all {n} turns answered 200 with a whole stream", failed=0))

    # silent-empty turns
    silent = [t for t in turns if (t.get("check") or {}).get("status") == "silent_empty"]
    share = len(silent) / n if n else 0.0
    if n and share >= RULES["silent_empty"]["fail_share"]:
        rules.append(_rule("silent_empty", "FAIL", f"{len(silent)} of {n} turns ({share:.0%}) came back 200 after "
                                                   ">= 1 s with no token", share=round(share, 3)))
    elif silent:
        rules.append(_rule("silent_empty", "WARN", f"{len(silent)} of {n} turns ({share:.0%}) came back 200 after "
                                                   f">= 1 s with no token (first: turn {silent[0]['turn']})",
                           share=round(share, 3)))
    else:
        rules.append(_rule("silent_empty", "PASS", "no silent-empty turn", share=0.0))

    # memory
    inconclusive: list[str] = []
    clean = [i for i in order if all((t.get("check") or {}).get("status") != "error" for t in sessions[i])]
    base_session = clean[0] if clean else None
    baseline = _memory_bytes(sessions[base_session][-1]) if base_session is not None else None
    after = [t for t in turns if base_session is not None and int(t["session"]) > base_session]
    after_readings = [b for b in (_memory_bytes(t) for t in after) if b is not None]
    readings = [b for b in (_memory_bytes(t) for t in turns) if b is not None]
    mem: dict[str, Any] = {"source": memory_source, "baseline_bytes": baseline, "baseline_session": base_session,
                           "first_bytes": readings[0] if readings else None,
                           "last_bytes": readings[-1] if readings else None,
                           "max_bytes": max(readings) if readings else None, "readings": len(readings)}
    # the slope is taken over the session ends AFTER the baseline: a one-off step right after it (an
    # allocator growing to the largest batch once, a cache's first entry) is growth, not a slope
    ends = [(float(i), float(b)) for i in order if (b := _memory_bytes(sessions[i][-1])) is not None
            and base_session is not None and i > base_session]
    per_turn = [(float(t["turn"]), float(b)) for t in turns if (b := _memory_bytes(t)) is not None]
    mem["slope_bytes_per_session"] = None if (s := _slope(ends)) is None else round(s)
    mem["slope_bytes_per_turn"] = None if (s := _slope(per_turn)) is None else round(s)
    memory_rules = ("memory_growth", "memory_slope", "memory_oscillation")
    if memory_source is None or not readings:
        why = (memory_note or "no memory source: NVML finds no GPU, no engine pid is known and the engine reports "
               "none") if memory_source is None else f"no memory reading came back from the {memory_source} source"
        inconclusive.append(why)
        rules += [_rule(r, "not judged", why) for r in memory_rules]
    elif base_session is None:
        why = "no error-free session to take the memory baseline from"
        inconclusive.append(why)
        rules += [_rule(r, "not judged", why) for r in memory_rules]
    elif baseline is None:
        why = f"no memory reading at the end of session {base_session} (the baseline)"
        inconclusive.append(why)
        rules += [_rule(r, "not judged", why) for r in memory_rules]
    elif not after_readings:
        why = (f"no session ran after the baseline (the end of session {base_session}): memory growth needs at "
               "least one more")
        inconclusive.append(why)
        rules += [_rule(r, "not judged", why) for r in memory_rules]
    else:
        growth = after_readings[-1] - baseline
        mem["growth_bytes"] = growth
        limit = RULES["memory_growth"]["fail_bytes"]
        rules.append(_rule("memory_growth", "FAIL" if growth > limit else "PASS",
                           f"{_mib(growth)} from the baseline ({_mib(baseline)} at the end of session {base_session}) "
                           f"to the last turn ({_mib(after_readings[-1])}); limit {_mib(limit)}",
                           growth_bytes=growth))
        slope = mem["slope_bytes_per_session"]
        post = len(ends)
        warn_slope = RULES["memory_slope"]["warn_bytes_per_session"]
        if slope is not None and post >= RULES["memory_slope"]["min_sessions_after_baseline"]:
            rules.append(_rule("memory_slope", "WARN" if slope > warn_slope else "PASS",
                               f"{_mib(slope)} a session over the {post} session ends after the baseline"
                               + (f" (> {_mib(warn_slope)}: a slow leak)" if slope > warn_slope else ""),
                               slope_bytes_per_session=slope))
        else:
            least = RULES["memory_slope"]["min_sessions_after_baseline"]
            rules.append(_rule("memory_slope", "not judged", f"needs >= {least} sessions after the baseline; "
                                                             f"{post} ran"))
        swing = max(after_readings) - min(after_readings)
        mem["oscillation_bytes"] = swing
        wl = RULES["memory_oscillation"]["warn_bytes"]
        rules.append(_rule("memory_oscillation", "WARN" if swing > wl else "PASS",
                           f"readings after the baseline swing by {_mib(swing)} (limit {_mib(wl)})",
                           oscillation_bytes=swing))

    # host memory beside VRAM (the NVML source with the engine's pid known): growth over the same baseline
    host = [(int(t["session"]), h) for t in turns if isinstance(h := (t.get("memory") or {}).get("host_bytes"), int)]
    if host and base_session is not None:
        base_h = next((h for si, h in reversed(host) if si == base_session), None)
        after_h = [h for si, h in host if si > base_session]
        if base_h is not None and after_h:
            grown = after_h[-1] - base_h
            mem["host_growth_bytes"] = grown
            limit = RULES["host_memory_growth"]["fail_bytes"]
            rules.append(_rule("host_memory_growth", "FAIL" if grown > limit else "PASS",
                               f"the engine's host memory (USS) {_mib(grown)} from {_mib(base_h)} at the end of "
                               f"session {base_session} to {_mib(after_h[-1])}; limit {_mib(limit)}",
                               growth_bytes=grown))
        else:
            rules.append(_rule("host_memory_growth", "not judged", "no host reading after the baseline"))

    # latency drift: the first and last (up to 5) complete sessions
    k = min(RULES["decode_drift"]["window_sessions"], len(complete) // 2)

    def window(sel: Sequence[int], key: str) -> list[float]:
        if key == "decode_tps":
            return [d for i in sel for t in sessions[i] if (d := turn_decode_tps(t)) is not None]
        return [float(t[key]) for i in sel for t in sessions[i] if isinstance(t.get(key), (int, float))]

    if k >= 1:
        head, tail = complete[:k], complete[-k:]
        d0, d1 = _median(window(head, "decode_tps")), _median(window(tail, "decode_tps"))
        if d0 and d1 is not None:
            ratio = d1 / d0
            fr = RULES["decode_drift"]["fail_ratio"]
            rules.append(_rule("decode_drift", "FAIL" if ratio < fr else "PASS",
                               f"median decode {d1:.1f} tok/s in the last {k} session(s) vs {d0:.1f} in the first "
                               f"{k} ({ratio:.0%}; FAIL below {fr:.0%})", ratio=round(ratio, 3), first=d0, last=d1))
        else:
            rules.append(_rule("decode_drift", "not judged", "no turn had a decode window of >= 100 ms"))
        f0, f1 = _median(window(head, "ttft_s")), _median(window(tail, "ttft_s"))
        if f0 and f1 is not None:
            ratio = f1 / f0
            wr = RULES["ttft_growth"]["warn_ratio"]
            grew = ratio > wr and f1 - f0 > RULES["ttft_growth"]["min_delta_s"]
            rules.append(_rule("ttft_growth", "WARN" if grew else "PASS",
                               f"median TTFT {f1:.3f} s in the last {k} session(s) vs {f0:.3f} s in the first {k} "
                               f"({ratio:.2f}x; WARN above {wr:g}x and +{RULES['ttft_growth']['min_delta_s']:g} s)",
                               ratio=round(ratio, 3), first=f0, last=f1))
        else:
            rules.append(_rule("ttft_growth", "not judged", "no TTFT was measured"))
    else:
        why = f"needs >= 2 complete sessions to compare the first with the last; {len(complete)} ran"
        rules += [_rule("decode_drift", "not judged", why), _rule("ttft_growth", "not judged", why)]

    # slow turns
    wall = RULES["slow_turn"]["warn_wall_s"]
    slow = [t for t in turns if isinstance(t.get("wall_s"), (int, float)) and t["wall_s"] > wall]
    slowest = max(turns, key=lambda t: t.get("wall_s") or 0.0) if turns else None
    if slow and slowest is not None:
        rules.append(_rule("slow_turn", "WARN", f"{len(slow)} turn(s) took > {wall:g} s; the slowest, turn "
                                                f"{slowest['turn']}, {slowest['wall_s']:.1f} s", slow=len(slow)))
    else:
        rules.append(_rule("slow_turn", "PASS", f"every turn within {wall:g} s"
                           + (f" (slowest {slowest['wall_s']:.1f} s)" if slowest else ""), slow=0))

    # answer quality
    leaked = [t for t in turns if (t.get("check") or {}).get("status") == "markup"]
    if leaked:
        rules.append(_rule("markup_in_content", "WARN", f"{len(leaked)} turn(s) left tool-call markup in content "
                                                        f"(first: turn {leaked[0]['turn']}: "
                                                        f"{leaked[0]['check']['reason']})", turns=len(leaked)))
    else:
        rules.append(_rule("markup_in_content", "PASS", "no tool-call markup in any answer's content", turns=0))

    def good(t: dict[str, Any]) -> bool:
        c = t.get("check") or {}
        return c.get("status") == "ok" and c.get("expected") is not False

    kq = min(RULES["quality_drift"]["window_sessions"], len(complete) // 2)
    if len(complete) >= RULES["quality_drift"]["min_sessions"] and kq >= 1:
        head_t = [t for i in complete[:kq] for t in sessions[i]]
        tail_t = [t for i in complete[-kq:] for t in sessions[i]]
        g0 = sum(map(good, head_t)) / len(head_t)
        g1 = sum(map(good, tail_t)) / len(tail_t)
        drop = g0 - g1
        pts = RULES["quality_drift"]["warn_points"]
        rules.append(_rule("quality_drift", "WARN" if drop >= pts else "PASS",
                           f"good answers {g1:.0%} in the last {kq} session(s) vs {g0:.0%} in the first {kq}"
                           + (f" (fell >= {pts:.0%} points)" if drop >= pts else ""), first=round(g0, 3),
                           last=round(g1, 3)))
    else:
        rules.append(_rule("quality_drift", "not judged", f"needs >= {RULES['quality_drift']['min_sessions']} "
                                                          f"complete sessions; {len(complete)} ran"))

    fails = [r for r in rules if r["outcome"] == "FAIL"]
    warns = [r for r in rules if r["outcome"] == "WARN"]
    if fails:
        verdict = "FAIL"
        reason = "; ".join(f"{r['rule']}: {r['reason']}" for r in fails)
    elif inconclusive:
        verdict = "INCONCLUSIVE"
        reason = inconclusive[0]
    elif warns:
        verdict = "WARN"
        reason = "; ".join(f"{r['rule']}: {r['reason']}" for r in warns)
    else:
        verdict = "PASS"
        growth_text = _mib(mem.get("growth_bytes"))
        reason = (f"{n} turns over {len(order)} sessions, no error, memory {growth_text} from the baseline "
                  f"({memory_source})")
    good_turns = sum(map(good, turns))
    return {"verdict": verdict, "reason": reason, "rules": rules, "memory": mem, "sessions": len(order),
            "complete_sessions": len(complete), "turns": n, "good_answers": good_turns}
