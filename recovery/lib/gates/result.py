"""One result shape for every gate, so the control plane's ``gate_results`` and
``backfill_gates`` rows, the Dagster asset checks and the refusal sentences read the
same four fields whichever phase evaluated the gate."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GateResult:
    gate: str  # the gate's name, which is also its asset check's name
    passed: bool
    observed: int  # the count the gate measured (keys, rows, partitions...), 0 when it measured none
    details: str  # the sentence a person reads: what was found, against what was allowed


@dataclass(frozen=True)
class StoredGate(GateResult):
    """A gate's result as the control plane keeps it: which stage evaluated it, at which sequence, in which run."""

    stage: str = ""
    seq: int | None = None
    run_id: str | None = None
