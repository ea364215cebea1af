"""Redaction: what a shared report must not reveal.

Applied to every line a report prints (the card redacts its whole text at the end, so
nothing can slip around it). Removes, by default:

- secrets: Hugging Face tokens (``hf_`` + 30 or more alphanumerics), OpenAI-style
  ``sk-`` keys, the value after ``--api-key`` / ``--hf-token`` / ``--token``,
  ``Authorization`` header values, the password of a ``scheme://user:password@`` URL, and
  ``*_TOKEN`` / ``*_API_KEY`` / ``*_SECRET`` / ``*_PASSWORD`` assignments, plus any
  literal secrets the caller passes;
- home directories (this user's, ``/home/<anyone>``, ``/root``, ``/Users/<anyone>``,
  ``C:\\Users\\<anyone>``) -> ``~``;
- directories the caller names (typically the model directory) -> a placeholder;
- this machine's hostname -> ``<host>`` and user name -> ``<user>``.

What is *stored* (the state file, the results database) or printed as data (``status``,
``runs --json``) must keep its paths and names, so it goes through the secrets part alone:
``redact_secrets`` for a string, ``redact_argv`` for a command line as a list (where the flag
and its value are two elements no text pattern sees together), ``redact_data`` for anything
JSON-shaped. engineroom keeps API keys by reference (an environment variable's name, a 0600
file), so these are the defence behind that design, not the design; this module stays the
one place that knows what a secret looks like.
"""

from __future__ import annotations

import dataclasses
import getpass
import os
import re
import socket
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

MASK = "***"

_HF_TOKEN = re.compile(r"\bhf_[A-Za-z0-9]{30,}")
_SK_KEY = re.compile(r"\bsk-[A-Za-z0-9_-]{20,}")
# Command-line flags whose value is a secret (llama.cpp: --api-key, -hft/--hf-token); not
# --api-key-file, whose value is a path.
_FLAG_NAMES = r"--(?:api[-_]key|hf[-_]token|token|password|auth[-_]token)|-hft"
# --api-key X, --api-key=X, and the JSON-list form "--api-key", "X"
_SECRET_FLAG = re.compile(
    r"((?<![\w-])(?:" + _FLAG_NAMES + r")(?![\w-])"
    r"(?:\s*=\s*|\s+|[\"']\s*,\s*[\"']))"
    r"([^\s\"',`|]+)",
    re.IGNORECASE,
)
_SECRET_FLAG_ALONE = re.compile(r"(?:" + _FLAG_NAMES + r")", re.IGNORECASE)   # one argv element
_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^/\s:@\"'`]+:)([^/\s@\"'`]+)(@)", re.IGNORECASE)
# Keys of JSON data whose string value is a secret: api_key, hf_token, LLAMA_API_KEY, password,
# Authorization... (not api_key_env / api_key_file: a variable's name and a path are references)
_SECRET_KEY = re.compile(r"(?:^|[_-])(?:api[_-]?key|token|secret|password|passwd|authorization)$", re.IGNORECASE)
_AUTHORIZATION = re.compile(
    r"(\bAuthorization[\"']?\s*[:=]\s*[\"']?)((?:Bearer|Basic|Token)\s+)?([^\s\"',}`|]+)",
    re.IGNORECASE,
)
_SECRET_ASSIGN = re.compile(
    r"(\b[A-Z0-9_]*(?:TOKEN|API_KEY|ACCESS_KEY|SECRET|SECRET_KEY|PASSWORD)\b[\"']?\s*[:=]\s*[\"']?)"
    r"([^\s\"',}`|]+)"
)
_HOME_PATTERNS = (
    # at a path's start only: a folder named home inside a path (/srv/x/home/data/...) is no home directory
    re.compile(r"(?<![\w.-])/home/[^/\s\"'`,;:)\]]+"),
    re.compile(r"(?<![\w.-])/Users/[^/\s\"'`,;:)\]]+"),
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
    except (ImportError, KeyError, OSError):  # no passwd entry, no env vars: nothing to redact
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
    text = redact_secrets(text, secrets)

    # 2. named directories (longest first so a parent does not pre-empt a child)
    for path, placeholder in sorted((paths or {}).items(), key=lambda kv: -len(kv[0])):
        path = str(path).rstrip("/\\")
        if len(path) > 1:
            text = re.sub(re.escape(path) + r"(?=[/\\\s\"'`,;:)\]]|$)", placeholder, text)

    # 3. home directories
    if home and home not in ("/", "") and len(home) > 1:
        text = re.sub(r"(?<![\w.-])" + re.escape(home.rstrip("/")) + r"(?![\w.-])", "~", text)
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


def redact_secrets(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every secret masked and nothing else changed (paths and names stay).

    For what engineroom stores or prints as data; ``redact`` does this first, then the rest.
    """
    if not text:
        return text
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, MASK)
    text = _HF_TOKEN.sub("hf_" + MASK, text)
    text = _SK_KEY.sub("sk-" + MASK, text)
    text = _SECRET_FLAG.sub(lambda m: m.group(1) + MASK, text)
    text = _AUTHORIZATION.sub(lambda m: m.group(1) + (m.group(2) or "") + MASK, text)
    text = _SECRET_ASSIGN.sub(lambda m: m.group(1) + MASK, text)
    text = _URL_PASSWORD.sub(lambda m: m.group(1) + MASK + m.group(3), text)
    return text


def is_secret_flag(arg: str) -> bool:
    """``--api-key`` and the like, alone (its value is the next argument)."""
    return _SECRET_FLAG_ALONE.fullmatch(arg) is not None


def redact_argv(argv: Sequence[Any], secrets: Iterable[str] = ()) -> list[Any]:
    """A command line (a list) with the value after each secret flag masked, and each element
    through ``redact_secrets`` (``--api-key=X`` is one element)."""
    secrets = tuple(secrets)
    out: list[Any] = []
    mask_next = False
    for arg in argv:
        if not isinstance(arg, str):
            out.append(redact_data(arg, secrets))
            mask_next = False
            continue
        out.append(MASK if mask_next else redact_secrets(arg, secrets))
        mask_next = not mask_next and is_secret_flag(arg)
    return out


def redact_data(value: Any, secrets: Iterable[str] = ()) -> Any:
    """A JSON-shaped value (dicts, lists, strings; a dataclass is made one) with secrets masked.

    Strings go through ``redact_secrets``, every list through ``redact_argv`` (any list of
    strings may be a command line), and the string value of a key that names a secret
    (``api_key``, ``*_TOKEN``, ``Authorization``...) is masked whatever it looks like.
    """
    secrets = tuple(secrets)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, str):
        return redact_secrets(value, secrets)
    if isinstance(value, Mapping):
        return {key: (MASK if isinstance(item, str) and item and isinstance(key, str) and _SECRET_KEY.search(key)
                      else redact_data(item, secrets))
                for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return redact_argv(value, secrets)
    return value
