"""Reconciliation is partitioned like the target: one Dagster partition per target partition.

The target's partitions come from the data (any column, any type), so they are a
``DynamicPartitionsDefinition`` kept in step with the warehouse: the damaged target's
partitions are registered before the first reconciliation runs, those only the expected
rows hold by the run that finds them (and both by a sensor, for the UI). A full
reconciliation is one run over the whole range (``BackfillPolicy.single_run``): labels
such as ``duplicate`` or ``mispartitioned`` need facts from more than one partition, and
one run gives one consistent snapshot.
"""

import dagster as dg

from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine import open_engine
from recovery.lib.identifiers import quote
from recovery.lib.snapshot import expected_rows_sql

TARGET_PARTITIONS_NAME = "target_partitions"
TARGET_PARTITIONS = dg.DynamicPartitionsDefinition(name=TARGET_PARTITIONS_NAME)
RANGE_START, RANGE_END = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"


def data_partitions(spec: DatasetSpec, *, expected: bool = True) -> list[str]:
    """Partitions present in the target or (with ``expected``) in the expected rows, as text, sorted."""
    p = quote(spec.target.partition)
    held = f"SELECT DISTINCT CAST({p} AS VARCHAR) AS p FROM {spec.target.table_name.sql()} WHERE {p} IS NOT NULL"
    if expected:
        held += (
            f" UNION SELECT DISTINCT CAST({p} AS VARCHAR) FROM ({expected_rows_sql(spec, None)}) WHERE {p} IS NOT NULL"
        )
    with open_engine(spec.warehouse).session(read_only=True) as s:
        rows = s.fetchall(f"{held} ORDER BY 1")
    return [r[0] for r in rows]


def register_target_partitions(instance: dg.DagsterInstance, spec: DatasetSpec, *, expected: bool = True) -> list[str]:
    """Add the data's partitions that Dagster does not know yet; returns all known keys in order."""
    known = set(instance.get_dynamic_partitions(TARGET_PARTITIONS_NAME))
    new = [p for p in data_partitions(spec, expected=expected) if p not in known]
    if new:
        instance.add_dynamic_partitions(TARGET_PARTITIONS_NAME, new)
    return list(instance.get_dynamic_partitions(TARGET_PARTITIONS_NAME))


def whole_range_tags(keys: list[str]) -> dict[str, str]:
    """Run tags that make one run cover every partition."""
    return {RANGE_START: keys[0], RANGE_END: keys[-1]}


def reconciliation_tags(instance: dg.DagsterInstance, spec: DatasetSpec) -> dict[str, str]:
    """The tags of a run over every partition Dagster knows. When none is known yet, the target's
    are registered (one pass over its partition column): the run's classification registers those
    only the expected rows hold itself (``register_found``), so no run pays for resolving the
    change log before it starts (a large share of a command's fixed cost). An
    empty target leaves no range to run over: then the expected rows' are registered too."""
    known = list(instance.get_dynamic_partitions(TARGET_PARTITIONS_NAME))
    return whole_range_tags(
        known
        or register_target_partitions(instance, spec, expected=False)
        or register_target_partitions(instance, spec)
    )


def register_found(instance: dg.DagsterInstance, partitions: list[str]) -> list[str]:
    """Register the partitions a classification found (target and expected rows) that Dagster
    does not know yet; returns them, in order."""
    known = set(instance.get_dynamic_partitions(TARGET_PARTITIONS_NAME))
    new = sorted({p for p in partitions if p is not None and p not in known})
    if new:
        instance.add_dynamic_partitions(TARGET_PARTITIONS_NAME, new)
    return new
