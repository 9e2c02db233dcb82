"""Where the code location finds its dataset spec.

The code location serves one dataset spec, named by ``RECOVERY_SPEC`` (a path), so a
team points the same package at its own dataset without editing code. The default
is the worked example shipped in ``sample_data/``.
"""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_SPEC = PROJECT_ROOT / "sample_data" / "transactions" / "spec.yaml"
EXAMPLE_OUTPUTS = ("*.duckdb*", "evidence", "reports", "incidents")
"""What ``make run`` leaves beside the example's spec (warehouse, WAL, evidence key, bundles,
reports, draft incidents): left out when the example's folder is copied to build a fresh one."""


def spec_path() -> Path:
    return Path(os.environ.get("RECOVERY_SPEC", str(EXAMPLE_SPEC))).resolve()


SPECS_ENV = "RECOVERY_SPECS"


def spec_paths() -> list[Path]:
    """Every dataset this code location serves: the ``RECOVERY_SPEC`` one first, then those named by
    ``RECOVERY_SPECS`` (a directory, whose ``*/spec.yaml`` and ``*.spec.yaml`` files are specs, or
    a list of spec files separated by ``os.pathsep``). Unset, it is the one dataset of ``RECOVERY_SPEC``."""
    served = spec_path()
    found: list[Path] = [served]
    raw = os.environ.get(SPECS_ENV, "").strip()
    for item in filter(None, raw.split(os.pathsep)) if raw else []:
        path = Path(item).resolve()
        if path.is_dir():
            candidates = sorted(path.glob("*/spec.yaml")) + sorted(path.glob("*.spec.yaml"))
        else:
            candidates = [path]
        for c in candidates:
            if c.resolve() not in found:
                found.append(c.resolve())
    return found
