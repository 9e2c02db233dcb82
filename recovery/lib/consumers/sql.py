"""Downstream consumers: SQL over the public target, published as managed views.

A consumer reads the dataset's public name, never a generation directly, so it sees
exactly what was published. Its own output is published the same way, as a view
over one of its namespaces, so that a restatement can keep the original output
beside the correction. Before it reads, it refuses to propagate rows of a fenced
generation (the check lives here, in the shared reader path, not in each
consumer's code).
"""

from __future__ import annotations

from recovery.lib import faults
from recovery.lib.consumers.outputs import CONSUMER_SCHEMA, refresh_output
from recovery.lib.control.plane import SCHEMA, control_plane_exists
from recovery.lib.dataset_spec.models import DatasetSpec, DownstreamSpec
from recovery.lib.dataset_spec.sql_files import render
from recovery.lib.engine.base import Engine, Session
from recovery.lib.errors import FencedGenerationError
from recovery.lib.identifiers import TableName, quote
from recovery.lib.retry import retrying


def consumer_table(spec: DatasetSpec, consumer: DownstreamSpec) -> TableName:
    return TableName(CONSUMER_SCHEMA, consumer.name)


def consumer_sql(spec: DatasetSpec, consumer: DownstreamSpec, target_relation: str | None = None) -> str:
    """The consumer's SQL over the public target (or any relation shaped like it)."""
    return render(
        spec.downstream_sql[consumer.name], target=target_relation or f"SELECT * FROM {spec.target.table_name.sql()}"
    )


def fenced_generations_in_target(s: Session, spec: DatasetSpec) -> list[str]:
    """Fenced generations whose rows the public target currently exposes."""
    if not control_plane_exists(s):
        return []
    gen = quote(spec.target.metadata.generation)
    rows = s.fetchall(
        f"SELECT DISTINCT t.{gen} FROM {spec.target.table_name.sql()} t "
        f"JOIN {SCHEMA}.generations g ON g.generation = t.{gen} WHERE g.fenced_at IS NOT NULL ORDER BY 1"
    )
    return [r[0] for r in rows]


def materialize_consumer(engine: Engine, spec: DatasetSpec, consumer: DownstreamSpec) -> int:
    """Refresh one consumer's output from the public target; refuses while fenced rows are exposed.

    The output is a managed namespace behind the view ``consumers.<name>``: a refresh
    rewrites the current namespace, or publishes a new one when the current must be kept
    (it carried a fenced generation's rows, or a restatement recorded it); see
    ``recovery.lib.consumers.outputs``.
    """

    def txn() -> int:
        with engine.transaction() as s:
            fenced = fenced_generations_in_target(s, spec)
            if fenced:
                raise FencedGenerationError(
                    fenced[0],
                    f"{spec.target.table} exposes its rows; consumer {consumer.name} is paused until the repair "
                    "is published",
                )
            rows = refresh_output(s, spec, consumer.name, consumer_sql(spec, consumer), actor="refresh").rows
            # the output rebuilt (or published anew) and recorded, not committed
            faults.checkpoint("consumer:refreshed")
            return rows

    rows = retrying(txn)
    faults.checkpoint("consumer:committed")
    return rows
