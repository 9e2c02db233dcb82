"""The code location: every phase's definitions from ``recovery/defs/``, plus the worked example."""

from pathlib import Path

import dagster as dg

from recovery.config import serving, spec_path
from recovery.example.defs import example_definitions
from recovery.orchestration import forget_dead_defs_state_storage


def definitions_for(spec: str | Path) -> dg.Definitions:
    """The code location's definitions for one dataset spec (what a launcher holding a spec uses)."""
    forget_dead_defs_state_storage()
    with serving(spec):
        return dg.Definitions.merge(
            dg.components.load_from_defs_folder(path_within_project=Path(__file__).parent),
            example_definitions(),
        )


@dg.definitions
def defs() -> dg.Definitions:
    return definitions_for(spec_path())
