"""Restate each downstream consumer against the repaired, published target.

Per consumer, one transaction: find the output the incident's damage reached (the
latest output built while the target exposed a failed generation's rows; kept as
it is, see ``outputs``), publish a corrected output in a new namespace through the
consumer's pointer, write the incident's ledger rows (original vs corrected per
key) and record the restatement. Re-running the incident reuses its corrected
namespace while that is still current and exact, so it changes nothing; after
late arrivals moved the target, it publishes a fresh correction.

Restating while the public target still exposes a fenced generation's rows would
only re-publish the damage, so it is refused before anything is written.
"""

from __future__ import annotations

from recovery.lib import faults
from recovery.lib.consumers.impact import impact_summary
from recovery.lib.consumers.outputs import (
    RESTATEMENTS,
    build_original,
    damaged_output,
    damaged_target,
    ensure_tables,
    managed,
    preserved_because,
    publish_output,
)
from recovery.lib.consumers.sql import consumer_sql, fenced_generations_in_target
from recovery.lib.control.plane import control_plane_exists, has_dataset_table
from recovery.lib.dataset_spec.models import DatasetSpec, DownstreamSpec
from recovery.lib.engine.base import Engine, Session
from recovery.lib.errors import FencedGenerationError, RecoveryError, SpecError
from recovery.lib.identifiers import TableName
from recovery.lib.notify import Notifier
from recovery.lib.pointers.managed_views import adopt_if_plain
from recovery.lib.reconcile.expected_cache import drop_staged, stage_expected
from recovery.lib.restatement.checks import record_checks, sql_consumer_check
from recovery.lib.restatement.record import ConsumerRestatement, mismatched_rows, record_restatement
from recovery.lib.retry import retrying


def check_request(
    engine: Engine, spec: DatasetSpec, incident_id: str, consumers: list[str] | None
) -> list[DownstreamSpec]:
    """Validate before writing (read-only): the incident id, the consumer names, and a target
    that exposes no fenced generation's rows. Returns the consumers to restate."""
    if (
        not isinstance(incident_id, str)
        or not incident_id
        or len(incident_id) > 100
        or incident_id.startswith(".")
        or not all(ch.isalnum() or ch in "-_." for ch in incident_id)
    ):
        raise SpecError(
            "incident_id",
            f"{incident_id!r} is not an incident id",
            "use letters, digits, '-', '_' and '.' only, e.g. INC-2024-031",
        )
    by_name = {c.name: c for c in spec.downstream}
    for i, name in enumerate(consumers or []):
        if name not in by_name:
            raise SpecError(
                f"consumers[{i}]",
                f"{name!r} is not a downstream consumer of {spec.dataset!r} (known: {', '.join(by_name) or 'none'})",
                "name consumers listed under downstream in the spec",
            )
    with engine.session(read_only=True) as s:
        if not control_plane_exists(s):
            raise RecoveryError(
                f"{spec.target.table} is not managed yet (no control plane). "
                f"Fix: ingest through the writer and publish the repair before restating"
            )
        fenced = fenced_generations_in_target(s, spec)
    if fenced:
        raise RecoveryError(
            f"{spec.target.table} still exposes rows of fenced generation {fenced[0]!r}; restating now "
            f"would re-publish the damage. Fix: publish the repair first, then restate"
        )
    return [by_name[n] for n in consumers] if consumers else list(spec.downstream)


def _restate_one(
    s: Session,
    spec: DatasetSpec,
    c: DownstreamSpec,
    *,
    incident_id: str,
    failed_generations: list[str] | None,
    actor: str,
    run_id: str | None,
) -> ConsumerRestatement:
    ensure_tables(s)
    fenced = fenced_generations_in_target(s, spec)
    if fenced:  # checked again inside the transaction that publishes
        raise FencedGenerationError(
            fenced[0], f"{spec.target.table} still exposes its rows. Fix: publish the repair first"
        )
    m = managed(spec, c.name)
    current = adopt_if_plain(s, m, actor=actor)
    prior = s.fetchone(
        f"SELECT original_namespace, corrected_namespace FROM {RESTATEMENTS} "
        f"WHERE incident_id = ? AND dataset = ? AND consumer = ?",
        [incident_id, spec.dataset, c.name],
    )
    select_sql = consumer_sql(spec, c)
    original = prior[0] if prior else damaged_output(s, spec, c.name, failed_generations)
    if original is None and current is not None and preserved_because(s, current) is not None:
        original = current  # e.g. adopted: what it was built from is unknown, so it is what was published
    if original is None:  # no output was built from the damage: compute what it would have been
        damaged = damaged_target(s, spec, failed_generations)
        original = (
            build_original(
                s,
                spec,
                c.name,
                consumer_sql(spec, c, f"SELECT * FROM {TableName.parse(damaged).sql()}"),
                damaged,
                actor=actor,
                incident_id=incident_id,
            )
            if damaged
            else current
        )
    faults.checkpoint("restate:original_found")
    reused = bool(
        prior
        and current is not None
        and prior[1] == current
        and mismatched_rows(s, f"SELECT * FROM {TableName.parse(current).sql()}", select_sql) == 0
    )
    corrected = (
        current
        if reused and current is not None
        else publish_output(s, spec, c.name, select_sql, actor=actor, reason=f"restatement of incident {incident_id}")
    )
    faults.checkpoint("restate:output_published")  # the consumer's pointer moved, its ledger not yet written
    return record_restatement(
        s,
        spec,
        c,
        incident_id=incident_id,
        original=original,
        corrected=corrected,
        reused=reused,
        actor=actor,
        run_id=run_id,
    )


def restate_consumers(
    engine: Engine,
    spec: DatasetSpec,
    incident_id: str,
    *,
    failed_generations: list[str] | None = None,
    consumers: list[str] | None = None,
    notifier: Notifier | None = None,
    actor: str = "restatement",
    run_id: str | None = None,
) -> list[ConsumerRestatement]:
    """Restate every consumer (or those named) for ``incident_id``; with a ``notifier``, tell each
    affected owner once (see ``notices.notify_owners``; a failed delivery raises after the others)."""
    selected = check_request(engine, spec, incident_id, consumers)
    results = []
    for c in selected:

        def txn(c: DownstreamSpec = c) -> ConsumerRestatement:
            with engine.transaction() as s:
                return _restate_one(
                    s,
                    spec,
                    c,
                    incident_id=incident_id,
                    failed_generations=failed_generations,
                    actor=actor,
                    run_id=run_id,
                )

        results.append(retrying(txn))
        faults.checkpoint("restate:committed")  # this consumer committed, the next ones not yet
    results = checked(engine, spec, incident_id, source_mismatches(engine, spec, results), run_id=run_id)
    faults.checkpoint("restate:checked")
    if notifier is not None:
        from recovery.lib.notify import NotificationError
        from recovery.lib.restatement.notices import notify_owners

        failures = notify_owners(engine, spec, incident_id, notifier, consumers=[r.consumer for r in results])
        results = refreshed(engine, spec, results)
        if failures:
            raise NotificationError("; ".join(failures))
    return results


def source_mismatches(
    engine: Engine, spec: DatasetSpec, results: list[ConsumerRestatement]
) -> list[ConsumerRestatement]:
    """Each restated output against its consumer's SQL over the source's expected rows at the
    watermark it was restated at (``mismatches_vs_source``; 0: they agree row for row).

    After the consumers' transactions, in one session: the expected rows are staged once per
    watermark, not once per consumer (that was most of the phase), from the rows kept earlier in
    the recovery when they serve (``expected_cache.py``).
    Exact after the fact: a restated namespace is never rewritten (it is recorded), and the
    expected rows at a fixed watermark do not move (the change log is append-only)."""
    if not results:
        return results
    by_name = {c.name: c for c in spec.downstream}
    out = {}
    with engine.session() as s:
        for watermark in sorted({r.watermark for r in results}, key=lambda w: (w is not None, w)):
            stage_expected(s, spec, watermark, "__restated_expected", keep=True)
            for r in (r for r in results if r.watermark == watermark):
                corrected = f"SELECT * FROM {TableName.parse(r.corrected_namespace).sql()}"
                expected = consumer_sql(spec, by_name[r.consumer], "SELECT * FROM __restated_expected")
                out[r.consumer] = r.model_copy(update={"mismatches_vs_source": mismatched_rows(s, corrected, expected)})
        drop_staged(s, "__restated_expected")
    return [out[r.consumer] for r in results]


def checked(
    engine: Engine, spec: DatasetSpec, incident_id: str, results: list[ConsumerRestatement], *, run_id: str | None
) -> list[ConsumerRestatement]:
    """The same results with their check (``checks.sql_consumer_check``), recorded for the reports:
    each compared with the source, and its ledger cross-checked with the impact's material rows."""
    if not results:
        return results

    def txn() -> list[ConsumerRestatement]:
        with engine.transaction() as s:
            material = (
                {i.consumer: i.material_rows for i in impact_summary(s, spec, incident_id=incident_id)}
                if has_dataset_table(s, "impact", spec.dataset)
                else {}
            )
            out = [
                r.model_copy(
                    update={
                        "check": sql_consumer_check(
                            r.consumer,
                            mismatches=r.mismatches_vs_source,
                            ledger_rows=r.ledger_rows,
                            impact_material=material.get(r.consumer, 0),
                        )
                    }
                )
                for r in results
            ]
            record_checks(s, spec.dataset, incident_id, [r.check for r in out if r.check], run_id=run_id)
            return out

    return retrying(txn)


def refreshed(engine: Engine, spec: DatasetSpec, results: list[ConsumerRestatement]) -> list[ConsumerRestatement]:
    """The same results with ``notified_at`` as recorded now."""
    if not results:
        return results
    with engine.session(read_only=True) as s:
        stamps = dict(
            s.fetchall(
                f"SELECT consumer, notified_at FROM {RESTATEMENTS} WHERE incident_id = ? AND dataset = ?",
                [results[0].incident_id, spec.dataset],
            )
        )
    return [r.model_copy(update={"notified_at": stamps.get(r.consumer)}) for r in results]


def notify_owners(*args, **kwargs):
    """See ``recovery.lib.restatement.notices.notify_owners``."""
    from recovery.lib.restatement.notices import notify_owners as _notify

    return _notify(*args, **kwargs)
