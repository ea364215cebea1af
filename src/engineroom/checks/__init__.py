"""Verify suites: each check is one function over (client, ServerInfo) -> CheckResult.

Checks never import the launcher or an engine adapter: what they know about the server
comes from the ``ServerInfo`` they are handed. The caller turns results into an exit code
(the number of FAILs) and stores them.
"""

from engineroom.checks.smoke import SMOKE_CHECKS, CheckResult, run_smoke

__all__ = ["CheckResult", "SMOKE_CHECKS", "run_smoke"]
