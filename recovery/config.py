"""Where the code location finds its dataset spec.

A deployed code location serves the spec named by ``RECOVERY_SPEC`` (a path), so a
team points the same package at its own dataset without editing code; the default
is the worked example shipped in ``sample_data/``. A launcher that already holds a
spec (the CLI, for the incident it was given) builds the definitions for that spec
as a value, through :func:`serving`, and never rewrites the environment.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
LOCATION_NAME = "backfill_recovery"
"""The package's code location, as ``workspace.yaml``'s ``location_name`` and pyproject's ``code_location_name``
spell it (``recovery_tests/defs/test_definitions.py`` checks that they agree): launchpad links name it."""
EXAMPLE_SPEC = PROJECT_ROOT / "sample_data" / "transactions" / "spec.yaml"
EXAMPLE_OUTPUTS = ("*.duckdb*", "evidence", "reports", "incidents")
"""What ``make run`` leaves beside the example's spec (warehouse, WAL, evidence key, bundles,
reports, draft incidents): left out when the example's folder is copied to build a fresh one."""

_SERVED: ContextVar[Path | None] = ContextVar("recovery_served_spec", default=None)


def spec_path() -> Path:
    """The spec being served: the one given to :func:`serving`, else ``RECOVERY_SPEC``, else the example's."""
    served = _SERVED.get()
    if served is not None:
        return served
    return Path(os.environ.get("RECOVERY_SPEC", str(EXAMPLE_SPEC))).resolve()


@contextmanager
def serving(path: str | Path) -> Iterator[Path]:
    """Within the block, the code location's definitions are built for ``path``."""
    token = _SERVED.set(Path(path).resolve())
    try:
        yield Path(path).resolve()
    finally:
        _SERVED.reset(token)


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
