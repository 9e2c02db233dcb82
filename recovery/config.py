"""Where the code location finds its dataset spec.

A deployed code location serves the spec named by ``RECOVERY_SPEC`` (a path), so a
team points the same package at its own dataset without editing code; the default
is the worked example shipped in ``sample_data/``. A launcher that already holds a
spec (the CLI, for the incident it was given) builds the definitions for that spec
as a value, through :func:`serving`, and never rewrites the environment.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Iterator

PROJECT_ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_SPEC = PROJECT_ROOT / "sample_data" / "transactions" / "spec.yaml"
EXAMPLE_OUTPUTS = ("*.duckdb*", "evidence", "reports")
"""What ``make run`` leaves beside the example's spec (warehouse, WAL, evidence key, bundles,
reports): left out when the example's folder is copied to build a fresh one."""

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
