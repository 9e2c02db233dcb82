"""Where a long phase spends its time, for whoever asks (``RECOVERY_TRACE=FILE``).

When the variable names a file, every traced step slower than ``RECOVERY_TRACE_MIN_S``
(default 0.5 s) is appended there as one JSON line (kind, seconds, when it ended, process, what):
the engine's statements and Great Expectations' batch validations. Off by default;
``python -m bench recover --trace`` turns it on and sums it per kind. A ``mark`` is a
moment, traced whatever the threshold: ``python -m bench fixed`` reads the first one to
give a command's fixed cost (process start to its first classification statement).
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

TRACE_VARIABLE = "RECOVERY_TRACE"


def trace(kind: str, seconds: float, what: str) -> None:
    path = os.environ.get(TRACE_VARIABLE)
    if not path or seconds < float(os.environ.get("RECOVERY_TRACE_MIN_S", "0.5")):
        return
    with open(path, "a") as f:
        f.write(
            json.dumps(
                {
                    "kind": kind,
                    "s": round(seconds, 3),
                    "at": round(time.time(), 3),
                    "pid": os.getpid(),
                    "what": " ".join(what.split())[:600],
                }
            )
            + "\n"
        )


def mark(what: str) -> None:
    """Trace a moment: seconds since the process started (``s``) and the wall clock (``at``)."""
    path = os.environ.get(TRACE_VARIABLE)
    if not path:
        return
    with open(path, "a") as f:
        f.write(
            json.dumps(
                {
                    "kind": "mark",
                    "s": round(seconds_since_process_start(), 3),
                    "at": time.time(),
                    "pid": os.getpid(),
                    "what": what,
                }
            )
            + "\n"
        )


_IMPORTED = time.monotonic()


def seconds_since_process_start() -> float:
    """From the kernel's record of the process's start (Linux, 10 ms ticks); elsewhere, since this module loaded."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
    except (OSError, ValueError, IndexError):
        return time.monotonic() - _IMPORTED


def peak_rss_mb() -> float:
    """This process's own peak resident memory (MB): ``VmHWM``, which ``exec`` starts afresh and
    ``/proc/self/clear_refs`` resets; ``ru_maxrss`` (elsewhere) survives ``exec``, so a process forked
    from a large one reports the parent's peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
