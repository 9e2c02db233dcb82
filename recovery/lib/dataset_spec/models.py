"""The dataset spec: everything the package knows about a dataset.

A spec is YAML validated in two stages, both before any write: its shape (pydantic:
types, plain identifiers, readable SQL files) and then its meaning against the
warehouse catalog, through a read-only session (tables and columns exist, the
source key is unique per version, the transform runs). Every failure is one
:class:`~recovery.lib.errors.SpecError` naming the field and the fix.
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from recovery.lib.dataset_spec.durations import parse_duration
from recovery.lib.dataset_spec.lakehouse import LakehouseTable
from recovery.lib.dataset_spec.loader import load_yaml_model, read_text_file, resolve_path
from recovery.lib.dataset_spec.sql_files import check_single_select
from recovery.lib.errors import SpecError
from recovery.lib.identifiers import TableName, check_identifier, is_plain_identifier

MAX_THREADS = 512
"""More DuckDB threads than any machine has cores: 100000 aborts the process while it starts them."""
MAX_BUSY_TIMEOUT_S = 86_400.0
"""A day: past it a locked warehouse is an outage to look at, not a wait."""
_MEMORY = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(%|(?:[KMGTP]i?)?B|bytes)\s*", re.IGNORECASE)

ConsumerKind = Literal["dashboard", "report", "export", "feature", "model", "experiment", "statement"]


def _whole_number(v: object) -> object:
    # pydantic reads true as 1 and false as 0 for a number: `threads: true` would pass as one thread
    if isinstance(v, bool):
        raise PydanticCustomError("int_not_bool", "is true or false, not a whole number")
    return v


def _number(v: object) -> object:
    if isinstance(v, bool):
        raise PydanticCustomError("float_not_bool", "is true or false, not a number")
    return v


WholeNumber = Annotated[int, BeforeValidator(_whole_number)]
"""An integer field that refuses a boolean (pydantic alone reads ``true`` as 1)."""
Number = Annotated[float, BeforeValidator(_number)]
"""A number field that refuses a boolean (an integer is still read as a number)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _ident(v: str) -> str:
    return check_identifier(v, "column")


def _idents(v: list[str]) -> list[str]:
    if not v:
        raise ValueError("must name at least one column")
    if len(set(v)) != len(v):
        raise ValueError("lists a column twice")
    return [check_identifier(x, "column") for x in v]


class SparkSpec(_Strict):
    """Where the Spark data plane lives and how to reach the cluster."""

    data_path: Path = Field(
        description="Directory (local, or a cluster file system path) holding the "
        "Parquet directories of every data relation, relative to the spec file."
    )
    master: str = Field(
        "local[2]",
        description="Spark master URL: local[N] for one machine, spark://host:7077, yarn or k8s://... on a cluster.",
    )
    conf: dict[str, str] = Field({}, description="Extra Spark settings (spark.executor.memory, ...).")

    @field_validator("data_path")
    @classmethod
    def _local_path(cls, v: Path) -> Path:
        if "://" in str(v) or str(v).startswith(("s3:", "s3a:", "gs:", "abfss:", "hdfs:")):
            raise ValueError(
                "object-store and HDFS URLs are not supported yet; give a directory that the driver and "
                "every executor see at the same path (a shared mount)"
            )
        return v


class WarehouseSpec(_Strict):
    engine: Literal["duckdb", "spark"] = Field("duckdb", description="Warehouse engine.")
    path: Path = Field(
        description="DuckDB database file, relative to the spec file; with engine spark it "
        "holds only the control plane (generations, fences, pointers, catalog)."
    )
    spark: SparkSpec | None = Field(None, description="Required when engine is spark.")
    memory_limit: str | None = Field(None, description="DuckDB memory_limit, e.g. '4GB' or '50%'; spills past it.")
    threads: WholeNumber | None = Field(None, ge=1, le=MAX_THREADS, description="DuckDB worker threads.")
    busy_timeout_s: Number = Field(
        300.0, gt=0, le=MAX_BUSY_TIMEOUT_S, description="How long to retry a locked warehouse file."
    )

    @field_validator("memory_limit")
    @classmethod
    def _memory(cls, v: str | None) -> str | None:
        # checked here, not left to DuckDB: '-1GB' or '0KB' would otherwise reach every connection
        if v is None:
            return v
        m = _MEMORY.fullmatch(v)
        if not m or float(m.group(1)) <= 0 or (m.group(2) == "%" and float(m.group(1)) > 100):
            raise ValueError(f"{v!r} is not a positive amount of memory such as '4GB', '512MiB' or '50%'")
        return v

    @model_validator(mode="after")
    def _spark_section(self) -> WarehouseSpec:
        if self.engine == "spark" and self.spark is None:
            raise ValueError(
                "engine is 'spark' but the spark section is missing; add "
                "spark: {data_path: <dir for Parquet data>, master: local[2]}"
            )
        if self.engine == "duckdb" and self.spark is not None:
            raise ValueError("a spark section is given but engine is 'duckdb'; set engine: spark or remove it")
        return self


class SourceSpec(_Strict):
    table: str = Field(description="The authoritative append-only change log, schema.table.")
    key: list[str] = Field(description="Stable key columns; the target uses the same names.")
    version: str = Field(description="Column whose value increases per key with each change.")
    op: str = Field(description="Column holding the change kind.")
    ingested_at: str = Field(description="Column holding when the change entered the source.")
    upsert_ops: list[str] = Field(["upsert"], min_length=1, description="Values of `op` meaning insert or update.")
    delete_ops: list[str] = Field(
        ["delete"], min_length=1, description="Values of `op` meaning a tombstone (list one even if the log has none)."
    )
    sensitive: list[str] = Field([], description="Columns held only as keyed hashes in evidence.")
    available_from: date | None = Field(
        None, description="Earliest partition for which the source holds authoritative rows."
    )
    lakehouse: LakehouseTable | None = Field(
        None, description="The change log is a Delta or Iceberg table; `table` is its name in the warehouse file."
    )

    @field_validator("table")
    @classmethod
    def _table(cls, v: str) -> str:
        return str(TableName.parse(v))

    @field_validator("key")
    @classmethod
    def _key(cls, v: list[str]) -> list[str]:
        return _idents(v)

    @field_validator("available_from")
    @classmethod
    def _passed(cls, v: date | None) -> date | None:
        # a source authoritative only from a future day would qualify every partition as unrecoverable
        today = max(date.today(), datetime.now(UTC).date())
        if v is not None and v > today:
            raise PydanticCustomError(
                "date_in_future", "{when} is in the future (today is {today})", {"when": str(v), "today": str(today)}
            )
        return v

    @field_validator("version", "op", "ingested_at")
    @classmethod
    def _cols(cls, v: str) -> str:
        return _ident(v)

    @field_validator("sensitive")
    @classmethod
    def _sens(cls, v: list[str]) -> list[str]:
        return [_ident(x) for x in v]

    @field_validator("upsert_ops", "delete_ops")
    @classmethod
    def _ops(cls, v: list[str]) -> list[str]:
        # an empty list would read no change as live and empty the source snapshot
        if any(not x.strip() or len(x) > 200 for x in v):
            raise ValueError("holds an empty or over-long op value")
        if len(set(v)) != len(v):
            raise ValueError("lists an op value twice")
        return v

    @model_validator(mode="after")
    def _ops_disjoint(self):
        both = sorted(set(self.upsert_ops) & set(self.delete_ops))
        if both:
            raise ValueError(f"source.delete_ops: {both} also listed in upsert_ops; a change is one or the other")
        return self

    @property
    def table_name(self) -> TableName:
        return TableName.parse(self.table)


class MetadataSpec(_Strict):
    generation: str = "_generation"
    source_version: str = "_source_version"
    written_at: str = "_written_at"

    @field_validator("generation", "source_version", "written_at")
    @classmethod
    def _cols(cls, v: str) -> str:
        return _ident(v)

    @model_validator(mode="after")
    def _distinct(self):
        if len({self.generation, self.source_version, self.written_at}) != 3:
            raise ValueError("generation, source_version and written_at must be three different columns")
        return self

    @property
    def columns(self) -> list[str]:
        return [self.generation, self.source_version, self.written_at]


class TargetSpec(_Strict):
    table: str = Field(description="The public name consumers read (a view the package manages).")
    partition: str = Field(description="Partition column produced by the transform.")
    transform: Path = Field(description="Row-level SQL over {{ source }}, relative to the spec file.")
    metadata: MetadataSpec = Field(default_factory=MetadataSpec)
    amount: str | None = Field(None, description="Numeric column summed into totals, if any.")
    event_time: str | None = Field(None, description="Event-time column, if any.")
    sensitive: list[str] = Field([], description="Columns held only as keyed hashes in evidence.")
    lakehouse: LakehouseTable | None = Field(
        None, description="The target is a Delta or Iceberg table; `table` is its name in the warehouse file."
    )

    @field_validator("table")
    @classmethod
    def _table(cls, v: str) -> str:
        return str(TableName.parse(v))

    @field_validator("partition")
    @classmethod
    def _cols(cls, v: str) -> str:
        return _ident(v)

    @field_validator("amount", "event_time")
    @classmethod
    def _opt(cls, v: str | None) -> str | None:
        return v if v is None else _ident(v)

    @field_validator("sensitive")
    @classmethod
    def _sens(cls, v: list[str]) -> list[str]:
        return [_ident(x) for x in v]

    @property
    def table_name(self) -> TableName:
        return TableName.parse(self.table)


class RegistrySpec(_Strict):
    """The team's own record of the runs that wrote the target (one row per generation).

    A target this package never wrote has no write log of ours; its runs' start and end
    times and the source watermark each one read let the reconciliation tell a key the
    target held before the backfill (``deleted``) from one it never had (``missing``), and a
    concurrent write the backfill clobbered (``overwritten``) from a stale read (``stale``).
    """

    table: str = Field(description="Schema-qualified registry table, e.g. ops.load_runs.")
    generation: str = Field(description="Column holding the generation id the target's rows carry.")
    kind: str | None = Field(None, description="Column telling a backfill from normal ingestion, if any.")
    started_at: str = Field(description="Column: when the run started (UTC).")
    ended_at: str | None = Field(None, description="Column: when the run committed its writes (UTC), if known.")
    source_watermark: str | None = Field(None, description="Column: the source's ingested_at the run read up to.")
    backfill_kinds: list[str] = Field(["backfill"], min_length=1, description="Values of `kind` that mark a backfill.")
    backfill_id: str | None = Field(
        None,
        description="Column: the Dagster backfill a run belonged to, if any (so an incident naming the backfill "
        "finds the loads it wrote, whatever id they carry).",
    )

    @field_validator("table")
    @classmethod
    def _table(cls, v: str) -> str:
        return str(TableName.parse(v))

    @field_validator("generation", "started_at")
    @classmethod
    def _cols(cls, v: str) -> str:
        return _ident(v)

    @field_validator("kind", "ended_at", "source_watermark", "backfill_id")
    @classmethod
    def _opt(cls, v: str | None) -> str | None:
        return v if v is None else _ident(v)

    @property
    def table_name(self) -> TableName:
        return TableName.parse(self.table)


class Materiality(_Strict):
    column: str
    abs: Number | None = Field(None, ge=0, description="A change is material when |diff| >= abs.")
    rel: Number | None = Field(None, ge=0, description="...or when |diff| / |original| >= rel.")

    @field_validator("column")
    @classmethod
    def _col(cls, v: str) -> str:
        return _ident(v)

    @model_validator(mode="after")
    def _one_threshold(self):
        if self.abs is None and self.rel is None:
            raise ValueError("give a threshold: abs, rel or both")
        return self


class ConsumerDecision(_Strict):
    """A decision a consumer's output fed (statements sent, features served, an extract filed):
    what the reconciliation lists per consumer and the recovery report shows original vs corrected for."""

    name: str = Field(min_length=1, description="What was decided from the output, e.g. 'June statements sent'.")
    remediation: str = Field(min_length=1, description="What correcting it takes, e.g. 're-issue the statements'.")


class DownstreamSpec(_Strict):
    name: str
    kind: ConsumerKind
    owner: str = Field(min_length=1)
    sql: Path = Field(description="SQL over {{ target }}, relative to the spec file.")
    key: list[str]
    materiality: Materiality | None = None
    decisions: list[ConsumerDecision] = Field(default_factory=list, description="Decisions the output fed (optional).")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _ident(v)

    @field_validator("key")
    @classmethod
    def _key(cls, v: list[str]) -> list[str]:
        return _idents(v)


class AssetConsumerSpec(_Strict):
    """A Dagster asset downstream of the target: the team's own code computes it, its IO manager
    stores it in a table of the warehouse. It is restated by launching its materialization for the
    affected partitions through Dagster; the ledger compares its rows by ``key`` before and after."""

    asset: str = Field(description="Its asset key as the UI shows it, e.g. marts/sensor_daily.")
    key: list[str] = Field(description="Columns identifying one row of its table, e.g. [sensor_id, day].")
    table: str | None = Field(
        None, description="Where its IO manager stores it, schema.table (default: the key's last two parts)."
    )
    partition: str | None = Field(
        None, description="Column holding its partition (dagster-duckdb's partition_expr); omit when unpartitioned."
    )
    owner: str = Field("unassigned", min_length=1, description="Who is told what changed.")
    kind: ConsumerKind = "report"
    materiality: Materiality | None = None
    decisions: list[ConsumerDecision] = Field(default_factory=list, description="Decisions the output fed (optional).")
    definitions: Path | None = Field(
        None,
        description="Python file of the team's code location (a Definitions object in it), relative to the spec; "
        "omit when the asset is in this code location.",
    )

    @field_validator("asset")
    @classmethod
    def _asset(cls, v: str) -> str:
        parts = v.split("/")
        for part in parts:
            if not is_plain_identifier(part):
                raise ValueError(f"{v!r} is not an asset key of plain names separated by '/' (e.g. marts/sensor_daily)")
        return v

    @field_validator("table")
    @classmethod
    def _table(cls, v: str | None) -> str | None:
        return v if v is None else str(TableName.parse(v))

    @field_validator("key")
    @classmethod
    def _key(cls, v: list[str]) -> list[str]:
        return _idents(v)

    @field_validator("partition")
    @classmethod
    def _partition(cls, v: str | None) -> str | None:
        return v if v is None else _ident(v)

    @field_validator("definitions")
    @classmethod
    def _python_file(cls, v: Path | None) -> Path | None:
        if v is not None and v.suffix != ".py":
            raise ValueError(f"{str(v)!r} is not a Python file (.py) holding the team's Definitions")
        return v

    @property
    def name(self) -> str:
        """What the ledger, the notices and the reports call it: the asset key."""
        return self.asset

    @property
    def asset_path(self) -> list[str]:
        return self.asset.split("/")

    @property
    def slug(self) -> str:
        """A plain identifier for the tables its captured outputs are kept in."""
        return "__".join(self.asset_path)

    @property
    def table_name(self) -> TableName:
        if self.table:
            return TableName.parse(self.table)
        path = self.asset_path
        return TableName(path[-2] if len(path) > 1 else "public", path[-1])


Consumer = DownstreamSpec | AssetConsumerSpec
"""A downstream consumer: SQL the package runs (``downstream``) or a Dagster asset the team's code computes."""


class ExpectationSpec(_Strict):
    type: str = Field(
        description="A Great Expectations expectation, snake_case, e.g. expect_column_values_to_be_between."
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Its arguments, e.g. {column: amount_usd, min_value: 0}."
    )

    @field_validator("type")
    @classmethod
    def _type(cls, v: str) -> str:
        if not re.fullmatch(r"expect_[a-z0-9_]+", v):
            raise ValueError(f"{v!r} is not an expectation name (snake_case, starting with expect_)")
        return v


class SuiteSpec(_Strict):
    name: str = Field(description="Suite name; becomes a blocking asset check on the repair generation.")
    expectations: list[ExpectationSpec] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _ident(v)


_INVARIANT_PLACEHOLDERS = ("rows", "generation", "source_latest")


class InvariantSpec(_Strict):
    name: str = Field(description="Invariant name; reported in the backfill's invariants gate.")
    sql: str = Field(
        description="One SELECT returning the violating rows of {{ rows }} (the backfilled partitions of the "
        "new generation); it may also read {{ generation }} (all its rows) and {{ source_latest }} "
        "(each key's latest source change as of the backfill's watermark, tombstones included)."
    )
    description: str = Field("", description="What the invariant promises, for the gate's report.")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _ident(v)

    @field_validator("sql")
    @classmethod
    def _sql(cls, v: str) -> str:
        probe = re.sub(r"\{\{\s*(generation|source_latest)\s*\}\}", "{{ rows }}", v)
        check_single_select(probe, "rows")
        return v


class ApprovalRule(_Strict):
    required: WholeNumber = Field(ge=1, description="Approvals this rule requires when it applies.")
    rows_over: WholeNumber | None = Field(
        None, ge=0, description="Applies when the scope's estimated rows exceed this."
    )
    partitions_over: WholeNumber | None = Field(
        None, ge=0, description="Applies when the scope has more partitions than this."
    )
    consumer_kinds: list[ConsumerKind] = Field(
        [], description="Applies when a consumer of one of these kinds reads the scope."
    )


class ApprovalPolicy(_Strict):
    approvers: list[str] = Field([], description="Who may approve a backfill of this dataset; empty: anyone named.")
    rules: list[ApprovalRule] = Field(
        default_factory=lambda: [ApprovalRule(required=1)],
        description="The required approvals are the largest `required` of the rules that apply.",
    )


class CapacityLimits(_Strict):
    max_rows: WholeNumber | None = Field(
        None, ge=1, description="Refuse a backfill estimated to write more rows than this."
    )
    max_bytes: WholeNumber | None = Field(
        None, ge=1, description="Refuse a backfill whose new generation is estimated larger."
    )
    max_partitions: WholeNumber | None = Field(
        None, ge=1, description="Refuse a backfill over more partitions than this."
    )
    free_disk_factor: Number = Field(2.0, ge=1, description="Free disk must hold this many times the estimated bytes.")
    rows_per_second: Number = Field(
        200_000, gt=0, description="Throughput assumed for the run-time estimate without history."
    )


class ColumnThresholds(_Strict):
    """Per-column overrides of the value gate's defaults (``recurrence.anomaly.columns.<column>``)."""

    max_changed_share: Number | None = Field(
        None, ge=0, le=1, description="Share of keys whose value may change undeclared."
    )
    max_mean_shift: Number | None = Field(
        None, ge=0, description="Largest shift of a partition's mean, in published std devs."
    )
    max_quantile_shift: Number | None = Field(
        None, ge=0, description="Largest shift of p10/p50/p90, in published std devs."
    )
    max_null_share_change: Number | None = Field(None, ge=0, le=1, description="Largest change of the null share.")
    max_distinct_change: Number | None = Field(None, ge=0, description="Largest relative change of the distinct count.")
    ignore: bool = Field(False, description="Leave the column out of the value gate (e.g. a load timestamp).")


class AnomalyThresholds(_Strict):
    max_row_change: Number = Field(
        0.05, ge=0, description="Largest relative change of a partition's row count vs published."
    )
    max_total_change: Number = Field(
        0.05, ge=0, description="Largest relative change of a partition's amount total vs published."
    )
    history_factor: Number = Field(
        3.0,
        gt=1,
        description="A partition's rows or total beyond this factor of the median of "
        "the published partitions (history) is an anomaly.",
    )
    # the value gate: key by key and column by column against the published rows (no per-column setup needed)
    max_changed_share: Number = Field(
        0.2,
        ge=0,
        le=1,
        description="Largest share of the range's keys whose value of one "
        "column may change without being declared (expect_change).",
    )
    max_missing_keys_share: Number = Field(
        0.05, ge=0, le=1, description="Largest share of published keys the backfill may drop."
    )
    max_new_keys_share: Number = Field(0.05, ge=0, le=1, description="Largest share of keys the backfill may add.")
    max_mean_shift: Number = Field(
        0.5, ge=0, description="Largest shift of a partition's column mean, in published std devs."
    )
    max_quantile_shift: Number = Field(
        0.5, ge=0, description="Largest shift of a partition's p10/p50/p90, in published std devs."
    )
    max_null_share_change: Number = Field(0.05, ge=0, le=1, description="Largest change of a partition's null share.")
    max_distinct_change: Number = Field(
        0.25, ge=0, description="Largest relative change of a partition's distinct count."
    )
    min_baseline_rows: WholeNumber = Field(
        20,
        ge=1,
        description="A partition with fewer published rows is profiled against the "
        "published history (the partitions outside the range) instead.",
    )
    columns: dict[str, ColumnThresholds] = Field({}, description="Per-column overrides of the value gate's thresholds.")

    @field_validator("columns")
    @classmethod
    def _column_names(cls, v: dict) -> dict:
        for name in v:
            _ident(name)
        return v


class RecurrenceSpec(_Strict):
    """The guarded backfill's policy for this dataset (every field optional)."""

    approval: ApprovalPolicy = Field(default_factory=ApprovalPolicy)
    capacity: CapacityLimits = Field(default_factory=CapacityLimits)
    anomaly: AnomalyThresholds = Field(default_factory=AnomalyThresholds)
    invariants: list[InvariantSpec] = Field([], description="SQL assertions every backfilled partition must satisfy.")
    current_partitions: WholeNumber = Field(
        2,
        ge=1,
        description="The latest partitions normal ingestion writes count as current: "
        "a backfill reaching them is flagged and refused unless acknowledged.",
    )

    @model_validator(mode="after")
    def _unique(self):
        names = [i.name for i in self.invariants]
        if len(set(names)) != len(names):
            raise ValueError("recurrence.invariants: two invariants share a name")
        return self


class ConvergenceSpec(_Strict):
    """How convergence verification judges changes that ingestion has not applied yet."""

    max_lag: timedelta = Field(
        timedelta(hours=24),
        description="How long a source change may wait after arriving before ingestion applies it: "
        "older pending changes fail verification like drift (e.g. '6h', '90m', '1d'; default 24h).",
    )

    @field_validator("max_lag", mode="before")
    @classmethod
    def _duration(cls, v: object) -> timedelta:
        try:
            return parse_duration(v)
        except ValueError as err:
            raise PydanticCustomError("duration", str(err)) from None


class DatasetSpec(_Strict):
    """A validated dataset spec, with its file paths resolved and its SQL loaded."""

    dataset: str
    warehouse: WarehouseSpec
    source: SourceSpec
    target: TargetSpec
    downstream: list[DownstreamSpec] = []
    downstream_assets: list[AssetConsumerSpec] = Field(
        default_factory=list,
        description="Dagster assets downstream of the target (see docs/restatement.md); those in this code "
        "location's asset graph are found without being listed, given their key.",
    )
    suites: list[SuiteSpec] = Field(
        default_factory=list, description="Great Expectations suites every repair must pass."
    )
    registry: RegistrySpec | None = Field(
        None,
        description="The team's own run registry, for targets this package "
        "did not write (see README, generation registry).",
    )
    recurrence: RecurrenceSpec | None = Field(
        None,
        description="Guarded-backfill policy: approvals, capacity, anomaly "
        "thresholds, invariants (defaults apply when absent).",
    )
    convergence: ConvergenceSpec | None = Field(
        None, description="Convergence verification: how long ingestion may lag (defaults apply when absent)."
    )
    spec_path: Path | None = Field(None, exclude=True)
    transform_sql: str = Field("", exclude=True)
    downstream_sql: dict[str, str] = Field(default_factory=dict, exclude=True)

    @field_validator("dataset")
    @classmethod
    def _name(cls, v: str) -> str:
        return _ident(v)

    @model_validator(mode="after")
    def _coherent(self):
        names = [d.name for d in self.downstream]
        if len(set(names)) != len(names):
            raise ValueError("downstream: two consumers share a name")
        assets = [a.asset for a in self.downstream_assets]
        if len(set(assets)) != len(assets):
            raise ValueError("downstream_assets: an asset is listed twice")
        shared = sorted(set(assets) & set(names))
        if shared:
            raise ValueError(f"downstream_assets: {shared} is also the name of a downstream consumer; rename one")
        suites = [x.name for x in self.suites]
        if len(set(suites)) != len(suites):
            raise ValueError("suites: two suites share a name")
        if (self.source.lakehouse or self.target.lakehouse) and self.warehouse.engine != "duckdb":
            raise ValueError("warehouse.engine: lakehouse tables are read and computed by DuckDB; use engine: duckdb")
        meta = set(self.target.metadata.columns)
        clash = meta & set(self.source.key + [self.target.partition])
        if clash:
            raise ValueError(f"target.metadata: {sorted(clash)} collide with key/partition columns")
        return self

    @property
    def key(self) -> list[str]:
        return list(self.source.key)

    @property
    def recurrence_policy(self) -> RecurrenceSpec:
        return self.recurrence or RecurrenceSpec()

    @property
    def convergence_policy(self) -> ConvergenceSpec:
        return self.convergence or ConvergenceSpec()

    @property
    def fingerprint(self) -> str:
        """Hash of the spec and its SQL: recorded as a generation's config hash."""
        # convergence only judges what is there (it changes no data): tuning its lag keeps the hash
        exclude: dict = {
            k: True
            for k in ("spec_path", "convergence", "recurrence", "registry", "downstream_assets")
            if k in ("spec_path", "convergence") or not getattr(self, k)
        }
        for side in ("source", "target"):  # unchanged for older specs
            if getattr(self, side).lakehouse is None:
                exclude[side] = {"lakehouse"}
        h = hashlib.sha256(self.model_dump_json(exclude=exclude).encode())
        h.update(self.transform_sql.encode())
        for name in sorted(self.downstream_sql):
            h.update(self.downstream_sql[name].encode())
        return h.hexdigest()[:16]


def parse_spec(path: str | Path) -> DatasetSpec:
    """Load and validate a spec's shape and files; touches no warehouse."""
    path = Path(path)
    source = str(path)
    spec = load_yaml_model(path, DatasetSpec, what="spec", example="sample_data/transactions/spec.yaml")
    base = resolve_path(Path.cwd(), path, "spec", source=source).parent
    warehouse = spec.warehouse.model_copy(
        update={"path": resolve_path(base, spec.warehouse.path, "warehouse.path", source=source)}
    )
    if warehouse.spark is not None:
        warehouse = warehouse.model_copy(
            update={
                "spark": warehouse.spark.model_copy(
                    update={
                        "data_path": resolve_path(
                            base, warehouse.spark.data_path, "warehouse.spark.data_path", source=source
                        )
                    }
                )
            }
        )
    source_spec, target_lake = spec.source, spec.target.lakehouse
    if spec.source.lakehouse is not None:
        source_spec = spec.source.model_copy(update={"lakehouse": spec.source.lakehouse.resolved(base)})
    if target_lake is not None:
        target_lake = target_lake.resolved(base)
    transform = resolve_path(base, spec.target.transform, "target.transform", source=source)
    transform_sql = _read_sql(transform, "target.transform", "source", source)
    downstream, downstream_sql = [], {}
    for i, d in enumerate(spec.downstream):
        p = resolve_path(base, d.sql, f"downstream[{i}].sql", source=source)
        downstream_sql[d.name] = _read_sql(p, f"downstream[{i}].sql", "target", source)
        downstream.append(d.model_copy(update={"sql": p}))
    assets = []
    for i, a in enumerate(spec.downstream_assets):
        if a.definitions is not None:
            field = f"downstream_assets[{i}].definitions"
            p = resolve_path(base, a.definitions, field, source=source)
            if not p.is_file():
                raise SpecError(
                    field,
                    f"{p} is not a file",
                    "name the Python file of the team's code location, relative to the spec",
                    source=source,
                )
            a = a.model_copy(update={"definitions": p})
        assets.append(a)
    target = spec.target.model_copy(update={"transform": transform, "lakehouse": target_lake})
    return spec.model_copy(
        update={
            "warehouse": warehouse,
            "source": source_spec,
            "target": target,
            "downstream": downstream,
            "downstream_assets": assets,
            "spec_path": path.resolve(),
            "transform_sql": transform_sql,
            "downstream_sql": downstream_sql,
        }
    )


def _read_sql(path: Path, field: str, placeholder: str, source: str) -> str:
    sql = read_text_file(
        path, field, what="SQL file", fix="point it at a readable .sql file, relative to the spec", source=source
    )
    try:
        check_single_select(sql, placeholder)
    except ValueError as e:
        raise SpecError(
            field, f"{path.name}: {e}", f"write one SELECT statement that reads {{{{ {placeholder} }}}}", source=source
        )
    return sql
