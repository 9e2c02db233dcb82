"""The worked example's code location, loaded beside the package's by ``workspace.yaml``.

It serves the example's pipeline (``analytics/transactions``, ``ingest_transactions`` and its
schedule, the in-process executor) for the spec ``RECOVERY_SPEC`` names, the worked example's
by default. A team's workspace loads ``recovery.definitions`` alone and sees none of it.
"""

import dagster as dg

from recovery.config import spec_path
from recovery.example.defs import example_definitions


@dg.definitions
def defs() -> dg.Definitions:
    return example_definitions(spec_path())
