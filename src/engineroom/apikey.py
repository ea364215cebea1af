"""API keys by reference: engineroom keeps where a key is, never the key.

Why: a key typed as an engine argument lands in the engine's argv (which every user of the
machine reads in ``/proc/PID/cmdline`` and ``ps``), in the state file ``status`` and ``switch``
read, in every stored run's conditions and on the card. So a launch names its key instead:

- ``--api-key-env VAR``: read from the environment at launch; only ``VAR`` is kept;
- ``--api-key-file PATH``: a file only the user can read (mode 0600 or stricter, refused
  otherwise); only the path is kept;
- ``--api-key KEY``: a convenience: engineroom writes KEY to a 0600 file of its own and keeps
  that file's path, as if ``--api-key-file`` had named it.

Whichever form, the engine is handed a file (its adapter renders the flag): a key read from
the environment is written to a 0600 file of engineroom's for that launch, so the engine's
argv and environment hold a path. engineroom's files live in ``state_dir()/keys`` (0700), one
per launch, so a refused or failed launch never overwrites the file a running server reads;
a successful launch removes the older ones and ``down`` removes them all.

``verify`` and ``bench`` against the managed server read the key from the file the server was
given, so they work from any shell without the key being given again.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import paths
from .errors import BadInput
from .launchargs import LaunchArgs

KEYS_DIR = "keys"
RECIPE_PLACEHOLDER = "<0600 key file written at launch>"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

# what an adapter's split_api_key returns: (args without the key arguments, --api-key KEY, --api-key-file F)
Splitter = Callable[[Sequence[str]], "tuple[list[str], str | None, str | None]"]


SHIM_KEY_FLAG = "--api-key-file"       # the launcher shim's own argument (not an engine's flag)


def launcher_shim(module: str, key_flag: str) -> str:
    """Python source for ``python -c SHIM --api-key-file PATH ARGS...``: it takes the file off its
    arguments, reads the key (first non-comment line), runs ``module`` as ``__main__`` with
    ``key_flag KEY`` appended to ``sys.argv`` in-process, and masks the key in every log record of
    that process (engines log their parsed arguments at start).

    For engines that take a key only as an argument or a variable of their own: the process's
    ``/proc/PID/cmdline`` and ``environ`` (and those of the workers it starts) hold the file's
    path only, never the key.
    """
    return (
        "import logging,runpy,sys\n"
        f"a=sys.argv[1:];i=a.index('{SHIM_KEY_FLAG}');p=a[i+1];del a[i:i+2]\n"
        "k=next(s for s in (x.strip() for x in open(p)) if s and not s.startswith('#'))\n"
        "f=logging.getLogRecordFactory()\n"
        "def r(*x,**y):\n"
        " rec=f(*x,**y);m=rec.getMessage()\n"
        " if k in m:rec.msg=m.replace(k,'<redacted>');rec.args=()\n"
        " return rec\n"
        "logging.setLogRecordFactory(r)\n"
        f"sys.argv=['{module}',*a,'{key_flag}',k]\n"
        f"runpy.run_module('{module}',run_name='__main__',alter_sys=True)\n"
    )


def shim_key_file(argv: Sequence[str], shim: str) -> str | None:
    """The key file a command line rendered with ``shim`` names (``python -c SHIM --api-key-file
    PATH ...``), or None: not launched through the shim."""
    argv = list(argv)
    if len(argv) >= 5 and argv[1] == "-c" and argv[2] == shim and argv[3] == SHIM_KEY_FLAG:
        return argv[4]
    return None


def keys_dir() -> Path:
    """engineroom's own key files: a folder only the user can enter."""
    path = paths.state_dir() / KEYS_DIR
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if os.name != "nt":
        os.chmod(path, 0o700)
    return path


def check_private(path: str | os.PathLike[str], flag: str = "--api-key-file") -> Path:
    """``path`` resolved, once it is a file no other user can read or change."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise BadInput(f"{flag} {path} is not a file.")
    mode = stat.S_IMODE(path.stat().st_mode)
    if os.name != "nt" and mode & 0o077:
        raise BadInput(f"{path} is open to other users (mode {mode:04o}); run `chmod 600 {path}` so only you "
                       "can read it, then try again.")
    return path.resolve()


def read_key_file(path: str | os.PathLike[str]) -> str:
    """The first key of a key file (one per line; blank lines and lines starting with # skipped)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise BadInput(f"cannot read the API-key file {path} ({exc.strerror}).") from None
    except UnicodeDecodeError:
        raise BadInput(f"the API-key file {path} is not text.") from None
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            return line
    raise BadInput(f"the API-key file {path} holds no key (one per line; lines starting with # are comments).")


def from_env(name: str, flag: str = "--api-key-env") -> str:
    """The key in environment variable ``name``; the error never repeats a value."""
    if not _ENV_NAME.match(name):
        # do not echo it: the likeliest mistake is the key itself given in place of a name
        raise BadInput(f"{flag} takes the name of an environment variable (letters, digits and _), "
                       "not the key itself.")
    value = os.environ.get(name, "").strip()
    if not value:
        raise BadInput(f"the environment variable {name} named by {flag} is not set (or is empty); export it first.")
    return value


def _one_key(key: str, flag: str = "--api-key") -> str:
    key = key.strip()
    if not key or "\n" in key or "\r" in key:
        raise BadInput(f"{flag} takes one key on one line.")
    return key


def write_private(key: str) -> Path:
    """A new 0600 file of engineroom's holding ``key``: created that way, never chmod-ed after."""
    path = keys_dir() / f"key-{secrets.token_hex(8)}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key + "\n")
    return path


def is_ours(path: str | os.PathLike[str] | None) -> bool:
    """Is ``path`` one of the key files engineroom wrote?"""
    if not path:
        return False
    try:
        return Path(path).resolve().parent == keys_dir().resolve()
    except OSError:
        return False


@dataclass(frozen=True)
class LaunchKey:
    """The key of one launch: the references the state keeps, and the file the engine reads."""

    env: str | None                     # the references the launch keeps (never a key): a variable's name ...
    file_ref: str | None                # ... or the key file's path
    extra_args: tuple[str, ...]         # the user's engine arguments with any key arguments taken out
    file: Path | None = None            # what the engine is handed (None: no key)
    written: bool = False               # engineroom wrote ``file`` for this launch
    moved: tuple[str, ...] = field(default_factory=tuple)   # key flags taken out of the extra args


def for_launch(*, api_key: str | None = None, api_key_env: str | None = None,
               api_key_file: str | os.PathLike[str] | None = None, extra_args: Sequence[str] = (),
               split: Splitter | None = None, write: bool = True) -> LaunchKey:
    """Check the key options (at most one, with a key after ``--`` counting as one) and make the file.

    A key passed after ``--`` (``-- --api-key KEY``, which is how a key reached llama-server
    before these options) is moved into the same mechanism rather than refused: the command
    keeps working and the key still never reaches the argv. A reference to a variable is read
    again at every launch (``switch`` included): the reference is what is kept, not the key.
    ``write=False`` (a recipe: what would run) reads and writes nothing and names a placeholder.
    """
    args, arg_key, arg_file = split(extra_args) if split else (list(extra_args), None, None)
    moved = tuple(flag for flag, v in (("--api-key", arg_key), ("--api-key-file", arg_file)) if v)
    api_key = api_key or arg_key
    api_key_file = api_key_file or arg_file
    given = [flag for flag, v in (("--api-key", api_key), ("--api-key-env", api_key_env),
                                  ("--api-key-file", api_key_file)) if v]
    if len(given) > 1:
        raise BadInput(f"give one of --api-key, --api-key-env and --api-key-file, not {' and '.join(given)} "
                       "(an engine argument after `--` counts).")
    if not write:
        placeholder = Path(api_key_file) if api_key_file else Path(RECIPE_PLACEHOLDER) if given else None
        return LaunchKey(None, None, tuple(args), placeholder, False, moved)
    if api_key:
        path = write_private(_one_key(api_key))
        return LaunchKey(None, str(path), tuple(args), path, True, moved)
    if api_key_env:
        key = from_env(api_key_env)
        return LaunchKey(api_key_env, None, tuple(args), write_private(key), True, moved)
    if api_key_file:
        path = check_private(api_key_file)
        read_key_file(path)                     # a file with no key is refused before the engine starts
        return LaunchKey(None, str(path), tuple(args), path, False, moved)
    return LaunchKey(None, None, tuple(args), None, False, moved)


def hidden_env(args: LaunchArgs) -> tuple[str, ...]:
    """The variables of engineroom's own environment an engine must not inherit: the one
    ``--api-key-env`` names (the engine reads the key from its file; inherited, the key would show
    in ``/proc/PID/environ``)."""
    return (args.api_key_env,) if args.api_key_env else ()


def discard(key: LaunchKey) -> None:
    """Remove the file written for a launch that did not happen."""
    if key.written and key.file is not None:
        key.file.unlink(missing_ok=True)


def keep_only(path: str | os.PathLike[str] | None) -> None:
    """Remove engineroom's key files except ``path`` (the running server's): older launches' keys."""
    keep = Path(path).resolve() if path else None
    for old in keys_dir().glob("key-*"):
        if keep is None or old.resolve() != keep:
            old.unlink(missing_ok=True)


def forget() -> None:
    """``down``: no server runs, so no key file of engineroom's is needed."""
    keep_only(None)


def for_client(*, api_key: str | None = None, api_key_env: str | None = None,
               server_key_file: str | None = None) -> str | None:
    """The key ``verify`` / ``bench`` send: the one given, else the managed server's own (its key file)."""
    if api_key and api_key_env:
        raise BadInput("give either --api-key or --api-key-env, not both.")
    if api_key:
        return _one_key(api_key)
    if api_key_env:
        return from_env(api_key_env)
    if server_key_file:
        return read_key_file(server_key_file)
    return None


UNAUTHORIZED = "the server wants an API key: pass --api-key-env VAR (or --api-key KEY)"
REFUSED = "the server refused the API key given (HTTP 401): check the key that --api-key-env or --api-key names"


def unauthorized_message(key_sent: bool) -> str:
    """The one sentence for an HTTP 401."""
    return (REFUSED if key_sent else UNAUTHORIZED) + "."
