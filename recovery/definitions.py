"""The code location: every phase's definitions from ``recovery/defs/``, plus the worked example."""

from pathlib import Path

import dagster as dg

from recovery.example.defs import example_definitions
from recovery.orchestration import forget_dead_defs_state_storage


@dg.definitions
def defs() -> dg.Definitions:
    forget_dead_defs_state_storage()
    return dg.Definitions.merge(
        dg.components.load_from_defs_folder(path_within_project=Path(__file__).parent),
        example_definitions(),
    )
