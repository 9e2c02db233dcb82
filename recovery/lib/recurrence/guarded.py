"""One call for the whole guarded backfill (tests, scripts): preflight → start → build → gate → publish.

The Dagster job runs the same steps as assets and blocking checks; this is the same
policy without Dagster. ``dry_run`` stops after the preflight and writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from recovery.lib.errors import RecoveryError
from recovery.lib.gates import GateResult
from recovery.lib.recurrence.gates.invariants import InvariantResult
from recovery.lib.recurrence.launch import Preflight, build_backfill, preflight, start_backfill
from recovery.lib.recurrence.publish import gate_backfill, publish_backfill
from recovery.lib.recurrence.recompute import Recompute, resolve_recompute
from recovery.lib.recurrence.record import latest_gates
from recovery.lib.recurrence.request import BackfillRequest
from recovery.lib.write.writer import Writer


@dataclass
class BackfillOutcome:
    backfill_id: str
    status: str  # dry_run | refused | failed | stopped | published
    preflight: Preflight
    gates: dict[str, GateResult] = field(default_factory=dict)
    invariants: list[InvariantResult] = field(default_factory=list)
    reason: str | None = None
    published_namespace: str | None = None

    @property
    def failed_gates(self) -> list[str]:
        return [g for g, r in self.gates.items() if not r.passed]


def run_guarded_backfill(
    writer: Writer,
    request: BackfillRequest,
    *,
    dry_run: bool = False,
    recompute: Recompute | None = None,
    run_id: str | None = None,
) -> BackfillOutcome:
    pf = preflight(writer, request)
    out = BackfillOutcome(request.id, "dry_run", pf, {g.gate: g for g in pf.gates})
    if dry_run:
        return out
    rec = start_backfill(writer, pf, recompute=recompute, run_id=run_id)
    if rec.status == "refused":
        out.status, out.reason = "refused", rec.reason
        return out
    if rec.status == "building":
        try:
            rec = build_backfill(writer, rec, recompute or resolve_recompute(request.recompute), run_id=run_id)
        except RecoveryError as err:
            out.status, out.reason = "failed", str(err)
            return out
    if rec.status == "stopped":  # refused while building (a key written twice): no post-build gates
        with writer.engine.session(read_only=True) as s:
            out.gates.update(latest_gates(s, request.id))
        out.status, out.reason = "stopped", rec.reason
        return out
    if rec.status == "built":
        results, out.invariants = gate_backfill(writer, request.id, run_id=run_id)
        out.gates.update({g.gate: g for g in results})
    result = publish_backfill(writer, request.id, run_id=run_id)
    with writer.engine.session(read_only=True) as s:
        out.gates.update(latest_gates(s, request.id))
    if result["published"]:
        out.status, out.published_namespace = "published", result["namespace"]
    else:
        out.status, out.reason = "stopped", result["reason"]
    return out
