"""One way to launch a recovery phase, for the CLI, ``recover``, the repair driver and the tests.

``phases`` is the table of phases (verb, Dagster job, the nodes that take the
incident as config, what must have run before); ``state`` reads, read-only, how far
an incident has got and refuses a phase launched out of order with one line naming
the verb to run first; ``runner`` launches a phase's job in this process against
the project's instance, with the definitions built for the incident's own spec.
"""

from recovery.launch.runner import Launcher
from recovery.launch.state import IncidentState, read_state
from recovery.lib.incident.phases import PHASES, Phase

__all__ = ["PHASES", "Phase", "Launcher", "IncidentState", "read_state"]
