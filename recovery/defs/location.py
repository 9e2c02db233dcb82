"""The code location's asset graph, for steps and sensors evaluated outside a repository.

A run launched with ``execute_in_process`` (the CLI, ``recover``, the tests) has no
repository on its context, yet impact tracing and the check alerts need the asset
graph (what lies downstream of the target). ``recovery.definitions`` records here
each code location it builds, by spec, so the phases below it can find the graph
without importing the layer above them.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg

_BUILT: dict[str, dg.Definitions] = {}


def remember(spec_path: str | Path, defs: dg.Definitions) -> None:
    _BUILT[str(Path(spec_path).resolve())] = defs


def asset_graph(context, spec_path: str | Path):
    """The repository's asset graph, else the graph of the code location built for ``spec_path``, else None."""
    repository = None
    try:
        repository = context.repository_def
    except Exception:  # noqa: BLE001 - Dagster raises a CheckError when no repository is set
        repository = None
    if repository is not None:
        return repository.asset_graph
    built = _BUILT.get(str(Path(spec_path).resolve()))
    return built.resolve_asset_graph() if built is not None else None
