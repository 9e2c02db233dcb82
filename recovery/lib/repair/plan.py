"""The repair plan: which partitions to rebuild, which to keep, in which waves.

The affected range is every partition where the reconciliation found damage (a
key's actual or expected partition, a partition-level finding) or where a fenced
generation's rows sit: it can reach beyond the backfill's nominal range. A
partition whose source holds no authoritative rows (before ``source.available_from``,
or whose rows' keys the source does not know at all, as after a retention purge)
is *qualified*: it keeps its rows, because the repair must not invent history.

Canary partitions are chosen greedily to cover every damage label found; the rest
follow in waves of a fixed size, in partition order.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

from recovery.lib.control.plane import SCHEMA, has_dataset_table
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.dataset_spec.partition_filter import in_partitions
from recovery.lib.engine.base import Session
from recovery.lib.errors import RecoveryError, SpecError
from recovery.lib.identifiers import quote, quote_all
from recovery.lib.incident.phases import ASSESS
from recovery.lib.pointers.namespaces import namespace_sql
from recovery.lib.reconcile.classify import partition_table, recon_table
from recovery.lib.repair.tables import PARTITIONS, PLANS
from recovery.lib.snapshot import str_list

CANARY = 0


class RepairPlan(BaseModel):
    model_config = ConfigDict(frozen=True)
    incident_id: str
    dataset: str
    generation: str
    namespace: str
    from_namespace: str
    failed_generations: list[str]
    low_seq: int
    source_watermark: datetime
    stamped_at: datetime
    high_seq: int | None
    published_seq: int | None
    status: str
    canary_max: int
    wave_size: int
    stopped_reason: str | None
    waves: dict[int, list[str]]  # 0 = canary
    qualified: dict[str, str]  # partition -> why the source is not authoritative there
    built: list[str]

    @property
    def rebuild(self) -> list[str]:
        return [p for w in sorted(self.waves) for p in self.waves[w]]

    def wave_of(self, partitions: list[str]) -> int:
        """The wave exactly covered by ``partitions``; raises naming the waves otherwise."""
        for n, parts in self.waves.items():
            if sorted(parts) == sorted(partitions):
                return n
        ranges = "; ".join(f"{wave_name(n)}: {ps[0]} .. {ps[-1]} ({len(ps)})" for n, ps in sorted(self.waves.items()))
        raise RecoveryError(
            f"partitions {partitions[:3]}{'...' if len(partitions) > 3 else ''} are not one wave of the "
            f"repair of {self.incident_id}; select one wave's range: {ranges}"
        )

    def next_wave(self) -> int | None:
        for n in sorted(self.waves):
            if any(p not in self.built for p in self.waves[n]):
                return n
        return None


def wave_name(n: int) -> str:
    return "canary" if n == CANARY else f"wave {n}"


def require_plan(s: Session, incident_id: str) -> RepairPlan:
    """The incident's repair plan, which the caller's step needs: none is a ``RecoveryError``."""
    plan = load_plan(s, incident_id)
    if plan is None:
        raise RecoveryError(f"incident {incident_id} has no repair plan; run the repair first")
    return plan


def load_plan(s: Session, incident_id: str) -> RepairPlan | None:
    if s.object_kind(SCHEMA, "repair_plans") is None:
        return None
    row = s.fetchone(
        "SELECT incident_id, dataset, generation, namespace, from_namespace, failed_generations, low_seq, "
        "source_watermark, "
        f"stamped_at, high_seq, published_seq, status, canary_max, wave_size, stopped_reason FROM {PLANS} "
        "WHERE incident_id = ?",
        [incident_id],
    )
    if row is None:
        return None
    names = [
        "incident_id",
        "dataset",
        "generation",
        "namespace",
        "from_namespace",
        "failed_generations",
        "low_seq",
        "source_watermark",
        "stamped_at",
        "high_seq",
        "published_seq",
        "status",
        "canary_max",
        "wave_size",
        "stopped_reason",
    ]
    fields = dict(zip(names, row))
    waves: dict[int, list[str]] = {}
    qualified, built = {}, []
    for partition, wave, reason, status in s.fetchall(
        f"SELECT partition, wave, qualified_reason, status FROM {PARTITIONS} WHERE incident_id = ? ORDER BY wave, "
        "partition",
        [incident_id],
    ):
        if reason is not None:
            qualified[partition] = reason
        else:
            waves.setdefault(wave, []).append(partition)
            if status == "built":
                built.append(partition)
    return RepairPlan(**fields, waves=waves, qualified=qualified, built=built)


def damaged_partitions(
    s: Session, spec: DatasetSpec, incident_id: str, current_ns: str, failed_generations: list[str]
) -> dict[str, list[str]]:
    """Partition (as text) -> damage labels found there (an empty list: a finding, or fenced rows)."""
    recon, parts = recon_table(spec), partition_table(spec)
    if not has_dataset_table(s, "recon", spec.dataset) or not s.scalar(
        f"SELECT count(*) FROM {parts} WHERE incident_id = ?", [incident_id]
    ):
        raise RecoveryError(
            f"incident {incident_id} has no reconciliation yet; run {ASSESS.job} "
            f"(or `recovery reconcile --incident FILE`) before planning the repair"
        )
    part, gen = quote(spec.target.partition), quote(spec.target.metadata.generation)
    rows = s.fetchall(
        f"""
        SELECT p, list(DISTINCT label ORDER BY label) FILTER (WHERE label IS NOT NULL) FROM (
            SELECT CAST(actual_partition AS VARCHAR) AS p, label FROM {recon} WHERE incident_id = ?
            UNION ALL SELECT CAST(expected_partition AS VARCHAR), label FROM {recon} WHERE incident_id = ?
            UNION ALL SELECT CAST("partition" AS VARCHAR), NULL FROM {parts} WHERE incident_id = ?
                AND (count_mismatch OR total_mismatch OR partially_updated OR written_after_fence > 0
                    OR failed_rows > 0)
            UNION ALL SELECT DISTINCT CAST({part} AS VARCHAR), NULL FROM {namespace_sql(current_ns)}
                WHERE {gen} IN ({str_list(failed_generations)})
        ) WHERE p IS NOT NULL GROUP BY p ORDER BY p
        """,
        [incident_id, incident_id, incident_id],
    )
    return {p: list(labels or []) for p, labels in rows}


def qualified_partitions(
    s: Session, spec: DatasetSpec, incident_id: str, partitions: list[str], current_ns: str
) -> dict[str, str]:
    """Partitions whose source is not authoritative, with the reason: before ``source.available_from``,
    or holding rows whose keys the source does not know at all while the source yields no
    expected row for the partition (its history was purged, or the change log has a gap)."""
    if not partitions:
        return {}
    src = spec.source
    part = quote(spec.target.partition)
    out: dict[str, str] = {}
    if src.available_from is not None:
        for (p,) in s.fetchall(
            "SELECT p FROM (SELECT unnest(CAST(? AS VARCHAR[])) AS p) WHERE TRY_CAST(p AS DATE) < CAST(? AS DATE)",
            [partitions, src.available_from],
        ):
            out[p] = f"before source.available_from ({src.available_from}): the source holds no authoritative rows"
    key = quote_all(spec.key)
    # only a partition the source yields no expected row for can qualify: the others are not looked
    # at (a lookup of their keys in the change log reads it to find nothing)
    expected = {
        p
        for (p,) in s.fetchall(
            f"SELECT CAST(partition AS VARCHAR) FROM {partition_table(spec)} WHERE incident_id = ? "
            "AND expected_rows > 0",
            [incident_id],
        )
    }
    rest = [p for p in partitions if p not in out and p not in expected]
    if rest:
        rows = s.fetchall(
            f"""
            WITH t AS (SELECT CAST({part} AS VARCHAR) AS p, {key} FROM {namespace_sql(current_ns)}
                       WHERE {in_partitions(s, spec, rest)}),
                 k AS (SELECT DISTINCT {key}, true AS __known FROM {src.table_name.sql()}
                       WHERE ({key}) IN (SELECT {key} FROM t))
            SELECT t.p, count(*), count(*) FILTER (WHERE k.__known IS NULL) FROM t LEFT JOIN k USING ({key})
            GROUP BY t.p HAVING count(*) FILTER (WHERE k.__known IS NULL) > 0
            ORDER BY t.p
            """
        )
        for p, n, unknown in rows:
            out[p] = (
                f"the source yields no row for this partition and holds no event for {unknown:,} of its {n:,} rows "
                f"(purged, or a gap in the change log)"
            )
    return out


def choose_canary(labels: dict[str, list[str]], *, canary_max: int, explicit: list[str] | None) -> list[str]:
    """Greedy cover of every label found, fewest partitions first; ties go to the earliest partition."""
    if explicit:
        unknown = [p for p in explicit if p not in labels]
        if unknown:
            raise SpecError(
                "canary_partitions",
                f"{unknown} are not partitions the repair rebuilds",
                f"choose among the damaged partitions, e.g. {sorted(labels)[:5]}",
            )
        return sorted(set(explicit))
    uncovered = {lab for labs in labels.values() for lab in labs}
    chosen: list[str] = []
    while uncovered and len(chosen) < canary_max:
        best = max(sorted(labels), key=lambda p: len(uncovered & set(labels[p])))
        if not uncovered & set(labels[best]):
            break
        chosen.append(best)
        uncovered -= set(labels[best])
    if not chosen and labels:
        chosen = [sorted(labels)[0]]
    return sorted(chosen)


def make_waves(partitions: list[str], canary: list[str], wave_size: int) -> dict[int, list[str]]:
    rest = [p for p in sorted(partitions) if p not in canary]
    waves = {CANARY: sorted(canary)}
    for i in range(0, len(rest), wave_size):
        waves[len(waves)] = rest[i : i + wave_size]
    return waves
