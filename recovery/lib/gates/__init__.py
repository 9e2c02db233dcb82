"""What every gate returns, repair gates and recurrence gates alike."""

from recovery.lib.gates.result import GateResult, StoredGate

__all__ = ["GateResult", "StoredGate"]
