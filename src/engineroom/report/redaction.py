"""``engineroom.redaction`` under the name report/ and its callers have always imported.

Redaction lives below ``launch`` and ``flows``, which redact what they store, so that nothing
imports up into report/. This name is the same module object (``sys.modules`` below), so
patching an attribute through either name patches both.
"""

from __future__ import annotations

import sys

from engineroom import redaction
from engineroom.redaction import MASK, is_secret_flag, redact, redact_argv, redact_data, redact_secrets

__all__ = ["MASK", "is_secret_flag", "redact", "redact_argv", "redact_data", "redact_secrets"]

sys.modules[__name__] = redaction
