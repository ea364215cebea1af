"""Checking a rendered SGLang command line with SGLang's own argument parser.

A small program runs in SGLang's environment: it builds ``argparse.ArgumentParser``, registers
every server flag with ``ServerArgs.add_cli_args`` (``sglang.srt.server_args``) and parses the
rendered arguments, exactly as ``sglang.launch_server`` does before it starts anything; then
``ServerArgs.from_cli_args`` builds SGLang's configuration record from them. Neither step needs
the model; the check hides the GPUs (nothing of it touches one), and a release whose record asks for an
accelerator as it builds (0.5.16: "No accelerator (CUDA, ...) is available") gets the parser's check alone,
the record said not checked: it is the machine's limit, not the command line's. What is not checked:
SGLang's resolution pipeline (``resolve_once``: reading the model's config.json, the device, the attention
backend, memory) — that runs at launch, on the machine that serves.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Sequence

from ...errors import BadInput, NotFound
from .command import server_args
from .discovery import Binary

# runs in SGLang's environment: argv[1] = a JSON list of argument lists; prints one JSON list of
# reports (the parser is built once: importing sglang.srt.server_args is most of the time)
_CHECK = r"""
import argparse, contextlib, io, json, sys, time
t0 = time.monotonic()
try:
    import sglang
    from sglang.srt.server_args import ServerArgs
except BaseException as exc:
    print(json.dumps({"import_error": f"{type(exc).__name__}: {exc}"})); sys.exit(0)
imported = round(time.monotonic() - t0, 2)
reports = []
for args in json.loads(sys.argv[1]):
    t1 = time.monotonic()
    report = {"parsed": False, "constructed": False, "checked": [], "not_checked": [],
              "sglang_version": getattr(sglang, "__version__", ""), "import_seconds": imported}
    reports.append(report)
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(args)
    except SystemExit:
        lines = [l for l in err.getvalue().strip().splitlines() if l.strip()]
        report["rejected"] = lines[-1] if lines else "the parser exited without a message"
        continue
    report["parsed"] = True
    report["checked"].append("ServerArgs.add_cli_args parser: flag names, value types and choices")
    report["values"] = {k: v for k, v in vars(ns).items() if isinstance(v, (str, int, float, bool, type(None)))}
    try:
        ServerArgs.from_cli_args(ns)
        report["constructed"] = True
        report["checked"].append("ServerArgs.from_cli_args: the configuration record builds from them")
    except BaseException as exc:
        if "No accelerator" in str(exc):    # the record's device defaults need a GPU (0.5.16; the check hides it)
            report["not_checked"].append(f"ServerArgs.from_cli_args: needs an accelerator, none visible here ({exc})")
        else:
            report["construct_error"] = f"{type(exc).__name__}: {exc}"
    report["not_checked"].append("ServerArgs.resolve_once (model config.json, device, attention backend, "
                                 "memory): runs at launch on the serving machine")
    report["seconds"] = round(time.monotonic() - t1, 3)
print(json.dumps(reports))
"""


def validation_reports(binary: Binary, argvs: Sequence[Sequence[str]], timeout: float = 600) -> list[dict]:
    """What SGLang's parser says of each rendered command line (one SGLang process for all):
    ``parsed``, ``constructed``, ``rejected`` (argparse's own sentence), ``checked`` /
    ``not_checked``, the parsed ``values``; ``wall_seconds`` is the whole check's time.

    Raises NotFound when the environment's Python does not run or has no importable sglang.
    """
    jobs = [server_args(argv) for argv in argvs]
    t0 = time.monotonic()
    try:
        proc = subprocess.run([str(binary.python), "-c", _CHECK, json.dumps(jobs)], capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, **binary.env, "CUDA_VISIBLE_DEVICES": ""})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NotFound(f"SGLang's parser could not be run with {binary.python} ({exc}).") from None
    try:
        answer = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise NotFound(f"SGLang's parser did not answer (exit {proc.returncode}): {tail}") from None
    if isinstance(answer, dict) and "import_error" in answer:
        raise NotFound(f"sglang.srt.server_args does not import with {binary.python}: {answer['import_error']}")
    wall = round(time.monotonic() - t0, 2)
    for report in answer:
        report["wall_seconds"] = wall
    return list(answer)


def validation_report(binary: Binary, argv: Sequence[str], timeout: float = 600) -> dict:
    """``validation_reports`` for one command line."""
    return validation_reports(binary, [argv], timeout=timeout)[0]


def _verdict(report: dict) -> str | None:
    if not report.get("parsed"):
        return f"SGLang's argument parser refuses the command line: {report.get('rejected')}"
    if not report.get("constructed") and report.get("construct_error"):
        return f"SGLang cannot build its server arguments from the command line: {report.get('construct_error')}"
    return None


def validate_argv(binary: Binary, argv: Sequence[str]) -> str | None:
    """None when SGLang's own parser accepts ``argv`` (and builds its ServerArgs from it), else
    the reason in one sentence. NotFound when SGLang is not there to ask."""
    try:
        return _verdict(validation_report(binary, argv))
    except BadInput as exc:
        return str(exc)


def validate_many(binary: Binary, argvs: Sequence[Sequence[str]]) -> list[str | None]:
    """``validate_argv`` for several command lines in one SGLang process (a cluster's nodes)."""
    try:
        return [_verdict(r) for r in validation_reports(binary, argvs)]
    except BadInput as exc:
        return [str(exc)] * len(argvs)
