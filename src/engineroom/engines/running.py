"""A running engine server, as every adapter reads it: what one health answer means, why a start failed,
the last meaningful line of its log while it starts, the bearer header a probe sends, the model id
``/v1/models`` lists, the errors that make a probe say "not this engine's", and the samples of a Prometheus
``/metrics`` page.

Engine-neutral: each adapter keeps its own facts (its health codes, failure patterns, log noise, endpoints and
metric names) and hands them to these.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import httpx

from .base import UNKNOWN_FAILURE, HealthState

# what a probe's answer of another shape raises: the server is not this adapter's (or not up)
PROBE_ERRORS = (httpx.HTTPError, ValueError, AttributeError, TypeError, KeyError, IndexError)


def health_from(status_code: int | None, answers: Mapping[int, HealthState], *, silent: HealthState) -> HealthState:
    """The state one health answer means by an engine's table: ``answers`` (status code -> state; any
    other code is ERROR), ``silent`` when nothing answered (``status_code`` None)."""
    if status_code is None:
        return silent
    return answers.get(status_code, HealthState.ERROR)


def failure_reason(log_text: str, patterns: Sequence[tuple[str, str]]) -> str:
    """The label of the first of ``patterns`` (regex over the lower-cased log, label; most specific
    first) that the log matches; UNKNOWN_FAILURE when none does."""
    lowered = log_text.lower()
    for pattern, label in patterns:
        if re.search(pattern, lowered):
            return label
    return UNKNOWN_FAILURE


def last_log_line(log_text: str, skip: re.Pattern[str], prefix: re.Pattern[str], width: int = 90) -> str | None:
    """The last of the log's last 40 lines that ``skip`` (an engine's noise: warnings, blank lines) does not
    match, without what ``prefix`` matches at its start (the engine's stamp), trimmed to ``width``; None if none."""
    for line in reversed(log_text.splitlines()[-40:]):
        if skip.search(line):
            continue
        text = prefix.sub("", line.strip())
        if text:
            return text[:width]
    return None


def bearer(api_key: str | None) -> dict[str, str]:
    """The header that hands a server its API key (none without a key)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def served_model_id(http: httpx.Client, url: str) -> str:
    """The first model id the server's ``/v1/models`` lists ("" when it answers with another status
    or an empty list)."""
    resp = http.get(f"{url}/v1/models")
    if resp.status_code != 200:
        return ""
    data = resp.json().get("data") or []
    return str(data[0].get("id", "")) if data else ""


def prometheus_samples(text: str) -> list[tuple[str, str, float]] | None:
    """(sample name, its family's name, value) of every sample of a Prometheus text page, in order;
    None when the page does not parse."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        return [(sample.name, family.name, float(sample.value))
                for family in text_string_to_metric_families(text) for sample in family.samples]
    except ValueError:
        return None


__all__ = ["PROBE_ERRORS", "bearer", "failure_reason", "health_from", "last_log_line", "prometheus_samples",
           "served_model_id"]
