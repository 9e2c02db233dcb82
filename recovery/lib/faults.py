"""Named fault points, for crash tests of multi-step operations.

``checkpoint(name)`` does nothing unless the environment variable
``RECOVERY_FAULT_AT`` names that point: then it writes the file named by
``RECOVERY_FAULT_READY`` (so a test knows the process got there) and waits to be
killed. Production runs never set the variable.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def checkpoint(name: str) -> None:
    if os.environ.get("RECOVERY_FAULT_AT") != name:
        return
    ready = os.environ.get("RECOVERY_FAULT_READY")
    if ready:
        Path(ready).write_text(name)
    while True:  # the test sends SIGKILL
        time.sleep(0.05)
