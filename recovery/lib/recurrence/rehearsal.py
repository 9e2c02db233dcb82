"""``backfill plan``: the whole guarded backfill, rehearsed on a scratch copy of the warehouse.

A dry run that only previews the scope cannot know whether the value gates would
refuse: that needs the recompute's rows. So the plan copies the DuckDB file (and its
WAL) into a temporary directory, runs the very same guarded backfill there (preflight,
manifest, build, every gate, publish), reads the value comparison of the candidate it
built, and deletes the copy. The warehouse itself is only read (the copy is taken
under a read-only session, so no writer commits half-way through it). The plan's
verdict is therefore the run's verdict on the same inputs: it would refuse exactly
when ``run`` would, unless the warehouse changes in between (then ``run`` re-checks
everything).

Spark keeps the data outside the DuckDB file, so there the plan is the preflight only
and says so.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from recovery.lib.engine import open_engine
from recovery.lib.recurrence.gates.values import ValueReport, compare_values
from recovery.lib.recurrence.guarded import BackfillOutcome, run_guarded_backfill
from recovery.lib.recurrence.publish import declared_of
from recovery.lib.recurrence.recompute import Recompute
from recovery.lib.recurrence.record import load_backfill
from recovery.lib.recurrence.request import BackfillRequest
from recovery.lib.write.writer import Writer


@dataclass
class Rehearsal:
    outcome: BackfillOutcome
    report: ValueReport | None
    rehearsed: bool  # False: the preflight only (Spark, or refused before any write)
    note: str = ""

    @property
    def would_publish(self) -> bool:
        return self.outcome.status in ("published", "dry_run") and all(g.passed for g in self.outcome.gates.values())


def value_report_of(writer: Writer, backfill_id: str) -> ValueReport | None:
    """The value comparison of a built backfill's kept candidate against the generation it started from."""
    with writer.engine.session(read_only=True) as s:
        rec = load_backfill(s, backfill_id)
        if rec is None or rec.namespace is None or rec.status not in ("built", "stopped", "published", "converged"):
            return None
        return compare_values(s, writer.spec, rec.namespace, rec.from_namespace, rec.partitions, declared_of(rec))


def rehearse(writer: Writer, request: BackfillRequest, *, recompute: Recompute | None = None) -> Rehearsal:
    """What ``run`` would do with this request, done on a copy; the warehouse is left byte-identical."""
    spec = writer.spec
    if spec.warehouse.engine != "duckdb":
        outcome = run_guarded_backfill(writer, request, dry_run=True)
        return Rehearsal(
            outcome,
            None,
            False,
            "Spark keeps the data outside the DuckDB file: the plan ran the "
            "pre-write gates only; the value gates run with `backfill run`",
        )
    source = Path(spec.warehouse.path)
    with tempfile.TemporaryDirectory(prefix="backfill-plan-") as scratch:
        copy = Path(scratch) / source.name
        with writer.engine.session(read_only=True):  # no writer commits while the file is copied
            shutil.copyfile(source, copy)
            wal = source.with_name(source.name + ".wal")
            if wal.exists():
                shutil.copyfile(wal, copy.with_name(copy.name + ".wal"))
        scratch_spec = spec.model_copy(update={"warehouse": spec.warehouse.model_copy(update={"path": copy})})
        rehearsal_writer = Writer(open_engine(scratch_spec.warehouse), scratch_spec, actor=writer.actor)
        outcome = run_guarded_backfill(rehearsal_writer, request, recompute=recompute)
        report = value_report_of(rehearsal_writer, request.id)
    note = "" if report is not None else "refused before any write: no candidate to compare"
    return Rehearsal(outcome, report, report is not None, note)
