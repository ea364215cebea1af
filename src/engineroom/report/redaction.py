"""Redaction: what a shared report must not reveal.

Applied to every line a report prints (the card redacts its whole text at the end, so
nothing can slip around it). Removes, by default:

- secrets: Hugging Face tokens (``hf_`` + 30 or more alphanumerics), OpenAI-style
  ``sk-`` keys, the value after ``--api-key`` / ``--hf-token`` / ``--token``,
  ``Authorization`` header values, and ``*_TOKEN`` / ``*_API_KEY`` / ``*_SECRET`` /
  ``*_PASSWORD`` assignments, plus any literal secrets the caller passes;
- home directories (this user's, ``/home/<anyone>``, ``/root``, ``/Users/<anyone>``,
  ``C:\\Users\\<anyone>``) -> ``~``;
- directories the caller names (typically the model directory) -> a placeholder;
- this machine's hostname -> ``<host>`` and user name -> ``<user>``.
"""

from __future__ import annotations

import getpass
import os
import re
import socket
from pathlib import Path
from typing import Iterable, Mapping

MASK = "***"

_HF_TOKEN = re.compile(r"\bhf_[A-Za-z0-9]{30,}")
_SK_KEY = re.compile(r"\bsk-[A-Za-z0-9_-]{20,}")
# --api-key X, --api-key=X, and the JSON-list form "--api-key", "X"
_SECRET_FLAG = re.compile(
    r"(--(?:api[-_]key|hf[-_]token|token|password|auth[-_]token)(?![\w-])"
    r"(?:\s*=\s*|\s+|[\"']\s*,\s*[\"']))"
    r"([^\s\"',`|]+)",
    re.IGNORECASE,
)
_AUTHORIZATION = re.compile(
    r"(\bAuthorization[\"']?\s*[:=]\s*[\"']?)((?:Bearer|Basic|Token)\s+)?([^\s\"',}`|]+)",
    re.IGNORECASE,
)
_SECRET_ASSIGN = re.compile(
    r"(\b[A-Z0-9_]*(?:TOKEN|API_KEY|ACCESS_KEY|SECRET|SECRET_KEY|PASSWORD)\b[\"']?\s*[:=]\s*[\"']?)"
    r"([^\s\"',}`|]+)"
)
_HOME_PATTERNS = (
    re.compile(r"/home/[^/\s\"'`,;:)\]]+"),
    re.compile(r"/Users/[^/\s\"'`,;:)\]]+"),
    re.compile(r"(?<![\w.-])/root(?![\w.-])"),
    re.compile(r"[A-Za-z]:\\Users\\[^\\\s\"'`,;]+", re.IGNORECASE),
)
# Names too generic to redact as a word without mangling ordinary text.
_GENERIC_NAMES = frozenset({"root", "localhost", "user", "admin", "runner"})


def _current_hostname() -> str:
    try:
        return socket.gethostname()
    except OSError:
        return ""


def _current_username() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry, no env vars: nothing to redact
        return ""


def _current_home() -> str:
    try:
        return str(Path.home())
    except RuntimeError:
        return os.environ.get("HOME", "")


def _word(name: str) -> re.Pattern[str]:
    return re.compile(r"(?<![\w-])" + re.escape(name) + r"(?![\w-])")


def redact(
    text: str,
    *,
    hostname: str | None = None,
    username: str | None = None,
    home: str | None = None,
    paths: Mapping[str, str] | None = None,
    secrets: Iterable[str] = (),
) -> str:
    """``text`` with secrets, home directories, hostname and user name removed.

    ``hostname`` / ``username`` / ``home`` default to this machine's; ``paths`` maps
    directories to placeholders (``{"/data/models": "<model-dir>"}``); ``secrets`` are
    literal strings to mask wherever they appear.
    """
    if not text:
        return text
    hostname = _current_hostname() if hostname is None else hostname
    username = _current_username() if username is None else username
    home = _current_home() if home is None else home

    # 1. secrets first, before any other rewrite could split them
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, MASK)
    text = _HF_TOKEN.sub("hf_" + MASK, text)
    text = _SK_KEY.sub("sk-" + MASK, text)
    text = _SECRET_FLAG.sub(lambda m: m.group(1) + MASK, text)
    text = _AUTHORIZATION.sub(lambda m: m.group(1) + (m.group(2) or "") + MASK, text)
    text = _SECRET_ASSIGN.sub(lambda m: m.group(1) + MASK, text)

    # 2. named directories (longest first so a parent does not pre-empt a child)
    for path, placeholder in sorted((paths or {}).items(), key=lambda kv: -len(kv[0])):
        path = str(path).rstrip("/\\")
        if len(path) > 1:
            text = re.sub(re.escape(path) + r"(?=[/\\\s\"'`,;:)\]]|$)", placeholder, text)

    # 3. home directories
    if home and home not in ("/", "") and len(home) > 1:
        text = re.sub(re.escape(home.rstrip("/")) + r"(?![\w.-])", "~", text)
    for pattern in _HOME_PATTERNS:
        text = pattern.sub("~", text)

    # 4. host and user names, as whole words
    names: list[tuple[str, str]] = []
    if hostname:
        names.append((hostname, "<host>"))
        short = hostname.split(".")[0]
        if short != hostname:
            names.append((short, "<host>"))
    if username:
        names.append((username, "<user>"))
    for name, placeholder in names:
        if len(name) >= 3 and name.lower() not in _GENERIC_NAMES:
            text = _word(name).sub(placeholder, text)
    return text
