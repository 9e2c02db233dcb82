"""The code location: every phase's definitions from ``recovery/defs/``.

The worked example's pipeline is its own code location (``recovery.example.location``), which
``workspace.yaml`` loads beside this one: a location serving a team's dataset holds none of it.
"""

import logging
import os
from pathlib import Path

import dagster as dg

from recovery.config import PROJECT_ROOT, serving, spec_path
from recovery.defs.location import remember
from recovery.orchestration import forget_dead_defs_state_storage


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


def definitions_for(spec: str | Path) -> dg.Definitions:
    """The code location's definitions for one dataset spec (what a launcher holding a spec uses)."""
    forget_dead_defs_state_storage()
    with serving(spec):
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
