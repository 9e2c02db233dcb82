"""The publish gate on concurrent writes: nothing ingestion wrote during the repair is lost or doubled.

Publish replays the writes that landed after the candidate was gated, then moves the pointer in
the same transaction. Before the move, every key any captured write touched (from the low
watermark on) is compared, row by row, with what the fixed snapshot plus those writes say the
generation must hold (``reference_sql``, a set expression written apart from the replay). A key
lost, added or doubled refuses the publish: the transaction rolls back and the pointer stays.
"""

from __future__ import annotations

from recovery.lib.engine.base import Session
from recovery.lib.gates import GateResult
from recovery.lib.identifiers import quote, quote_all
from recovery.lib.pointers.namespaces import namespace_sql
from recovery.lib.repair.gates import reconciliation_gate, reference_sql
from recovery.lib.repair.plan import RepairPlan
from recovery.lib.repair.replay import latest_delta_sql
from recovery.lib.repair.tables import snapshot_table
from recovery.lib.write.writer import Writer

PRESERVATION_GATE = "repair_concurrent_writes"


def preservation_gate(
    s: Session, writer: Writer, plan: RepairPlan, *, through_seq: int, scope: list[str]
) -> GateResult:
    """Compare the generation with the reference on every key a captured write touched in
    ``(low_seq, through_seq]``, within the partitions the candidate covers (``scope``)."""
    spec = writer.spec
    key = quote_all(spec.key)
    part = quote(spec.target.partition)
    delta = latest_delta_sql(writer, plan, plan.low_seq, through_seq)
    s.temp_table("__cw_keys", f"SELECT DISTINCT {key} FROM ({delta})")
    try:
        n_keys = int(s.scalar("SELECT count(*) FROM __cw_keys") or 0)
        if n_keys == 0:
            return GateResult(PRESERVATION_GATE, True, 0, "0 keys written during the repair: nothing to compare")
        # where those keys sit on either side: the writes' own partitions, the candidate's, the snapshot's
        # and the published namespace's (a row lost from a partition no write named is found there)
        sides = [f"({delta})", namespace_sql(plan.namespace), snapshot_table(spec), namespace_sql(plan.from_namespace)]
        touched = {
            r[0]
            for r in s.fetchall(
                "SELECT DISTINCT CAST(p AS VARCHAR) FROM ("
                + " UNION ALL ".join(
                    f"SELECT {part} AS p FROM {rel} SEMI JOIN __cw_keys USING ({key})" for rel in sides
                )
                + ") WHERE p IS NOT NULL"
            )
        }
        in_scope = sorted(touched & set(scope))
        result = reconciliation_gate(
            s,
            spec,
            plan,
            in_scope,
            reference_sql(s, spec, plan, through_seq, writer),
            keys="__cw_keys",
            gate=PRESERVATION_GATE,
        )
        if result.passed:
            return GateResult(
                PRESERVATION_GATE,
                True,
                0,
                f"{n_keys:,} keys written during the repair, in {len(in_scope):,} partitions: each equals the "
                f"snapshot plus the captured writes",
            )
        return GateResult(
            PRESERVATION_GATE, False, result.observed, f"of {n_keys:,} keys written during the repair, {result.details}"
        )
    finally:
        s.drop_relation("__cw_keys")
