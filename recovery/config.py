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
