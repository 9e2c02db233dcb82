"""The code location: every phase's definitions from ``recovery/defs/``, plus the worked example."""

from pathlib import Path

import dagster as dg

from recovery.config import serving, spec_path
from recovery.defs.location import remember
from recovery.example.defs import example_definitions
from recovery.orchestration import forget_dead_defs_state_storage


def definitions_for(spec: str | Path) -> dg.Definitions:
    """The code location's definitions for one dataset spec (what a launcher holding a spec uses)."""
    forget_dead_defs_state_storage()
    with serving(spec):
        built = dg.Definitions.merge(
            dg.components.load_from_defs_folder(path_within_project=Path(__file__).parent),
            example_definitions(),
        )
    remember(spec, built)  # for steps run in process, which have no repository to ask for the asset graph
    return built


@dg.definitions
def defs() -> dg.Definitions:
    return definitions_for(spec_path())
