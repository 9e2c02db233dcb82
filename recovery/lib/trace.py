"""Where a long phase spends its time, for whoever asks (``RECOVERY_TRACE=FILE``).

When the variable names a file, every traced step slower than ``RECOVERY_TRACE_MIN_S``
(default 0.5 s) is appended there as one JSON line (kind, seconds, process, what):
the engine's statements and Great Expectations' batch validations. Off by default;
``python -m bench recover --trace`` turns it on and sums it per kind.
"""

from __future__ import annotations

import json
import os

TRACE_VARIABLE = "RECOVERY_TRACE"


def trace(kind: str, seconds: float, what: str) -> None:
    path = os.environ.get(TRACE_VARIABLE)
    if not path or seconds < float(os.environ.get("RECOVERY_TRACE_MIN_S", "0.5")):
        return
    with open(path, "a") as f:
        f.write(
            json.dumps({"kind": kind, "s": round(seconds, 3), "pid": os.getpid(), "what": " ".join(what.split())[:600]})
            + "\n"
        )
