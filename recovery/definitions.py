"""The code location: every phase's definitions from ``recovery/defs/``.

The worked example's pipeline is its own code location (``recovery.example.location``), which
``workspace.yaml`` loads beside this one: a location serving a team's dataset holds none of it.
"""

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from pathlib import Path

import dagster as dg

from recovery.config import PROJECT_ROOT, serving, spec_path
from recovery.defs.location import remember
from recovery.orchestration import forget_dead_defs_state_storage
from recovery.startup import settling


def instance_hint() -> str | None:
    """One line when Dagster's own commands run on a throwaway instance.

    With ``DAGSTER_HOME`` unset, ``dagster dev`` and ``dagster definitions validate`` work from
    the repo root on a temporary instance (``dagster.yaml`` needs no variable); the runs of
    ``make run`` and the ``recovery`` command live in ``.dagster_home``, so say how to see them.
    """
    home = os.environ.get("DAGSTER_HOME", "")
    if home and not Path(home).name.startswith(".tmp_dagster_home_"):
        return None
    return (
        f"DAGSTER_HOME is not set, so Dagster uses a temporary instance: "
        f"export DAGSTER_HOME={PROJECT_ROOT / '.dagster_home'} to use the one make run and make ui use"
    )


_hinted: list[str] = []


_NO_PLUGIN_CATALOG: ContextVar[bool] = ContextVar("recovery_no_plugin_catalog", default=False)


def _install_plugin_catalog_switch() -> None:
    """Dagster's loader adds to the definitions it builds the catalog of the component types that
    the installed plugins declare (their JSON schemas and sample YAML, as metadata for ``dg`` and
    the UI's component list). Within ``_NO_PLUGIN_CATALOG`` it leaves that metadata out: a process
    that only runs jobs in process never reads it. Idempotent; the code location served to the UI
    is built with it."""
    from dagster.components.core import load_defs

    shipped = load_defs.get_library_json_enriched_defs
    if getattr(shipped, "recovery_switch", False):
        return

    def enriched(tree):
        return dg.Definitions(component_tree=tree) if _NO_PLUGIN_CATALOG.get() else shipped(tree)

    enriched.recovery_switch = True  # type: ignore[attr-defined]
    load_defs.get_library_json_enriched_defs = enriched


@contextmanager
def _without_plugin_catalog() -> Iterator[None]:
    _install_plugin_catalog_switch()
    token = _NO_PLUGIN_CATALOG.set(True)
    try:
        yield
    finally:
        _NO_PLUGIN_CATALOG.reset(token)


def definitions_for(spec: str | Path, *, plugin_catalog: bool = True) -> dg.Definitions:
    """The code location's definitions for one dataset spec (what a launcher holding a spec uses).

    ``plugin_catalog=False`` (a launcher running jobs in process, the CLI) builds the same
    definitions without the installed plugins' component catalog, which only ``dg`` and the UI read."""
    forget_dead_defs_state_storage()
    with serving(spec), nullcontext() if plugin_catalog else _without_plugin_catalog(), settling():
        built = dg.components.load_from_defs_folder(path_within_project=Path(__file__).parent)
    remember(spec, built, own=True)  # for steps run in process, which have no repository to ask for the asset graph
    return built


@dg.definitions
def defs() -> dg.Definitions:
    hint = instance_hint()
    if hint and not _hinted:
        _hinted.append(hint)
        logging.getLogger("dagster").warning(hint)
    return definitions_for(spec_path())
