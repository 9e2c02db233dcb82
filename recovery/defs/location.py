"""The code location's asset graph, for steps and sensors evaluated outside a repository.

A run launched with ``execute_in_process`` (the CLI, ``recover``, the tests) has no
repository on its context, yet impact tracing, restatement and the check alerts need the
asset graph (what lies downstream of the target). ``recovery.definitions`` records here
each code location it builds, by spec, so the phases below it can find the graph
without importing the layer above them, and which asset keys are the package's own (a
team that merges them into its own code location brings the rest: its downstream assets).
A launcher given other definitions (the package's merged with a team's) records those.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg

_BUILT: dict[str, dg.Definitions] = {}
_OWN: dict[str, frozenset[dg.AssetKey]] = {}


def remember(spec_path: str | Path, defs: dg.Definitions, *, own: bool = False) -> None:
    """Record the definitions steps run in process use for ``spec_path``; ``own``: they are the
    package's own, whose asset keys are never a team's consumers."""
    key = str(Path(spec_path).resolve())
    _BUILT[key] = defs
    if own:
        _OWN[key] = frozenset(defs.resolve_all_asset_keys())


def own_asset_keys(spec_path: str | Path) -> frozenset[dg.AssetKey]:
    return _OWN.get(str(Path(spec_path).resolve()), frozenset())


def repository(context, spec_path: str | Path) -> dg.RepositoryDefinition | None:
    """The run's repository, else the one of the definitions recorded for ``spec_path``, else None."""
    try:
        repo = context.repository_def if context is not None else None
    except Exception:  # noqa: BLE001 - Dagster raises a CheckError when no repository is set
        repo = None
    if repo is not None:
        return repo
    built = _BUILT.get(str(Path(spec_path).resolve()))
    return built.get_repository_def() if built is not None else None


def asset_graph(context, spec_path: str | Path):
    """The repository's asset graph, else the graph of the code location built for ``spec_path``, else None."""
    repo = repository(context, spec_path)
    return repo.asset_graph if repo is not None else None
