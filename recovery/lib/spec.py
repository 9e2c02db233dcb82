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
from datetime import date
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from recovery.lib.errors import SpecError
from recovery.lib.identifiers import TableName, check_identifier
from recovery.lib.sql_files import check_single_select

ConsumerKind = Literal["dashboard", "report", "export", "feature", "model", "experiment", "statement"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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

    data_path: Path = Field(description="Directory (local, or a cluster file system path) holding the "
                                        "Parquet directories of every data relation, relative to the spec file.")
    master: str = Field("local[2]", description="Spark master URL: local[N] for one machine, "
                                                "spark://host:7077, yarn or k8s://... on a cluster.")
    conf: dict[str, str] = Field({}, description="Extra Spark settings (spark.executor.memory, ...).")

    @field_validator("data_path")
    @classmethod
    def _local_path(cls, v: Path) -> Path:
        if "://" in str(v) or str(v).startswith(("s3:", "s3a:", "gs:", "abfss:", "hdfs:")):
            raise ValueError("object-store and HDFS URLs are not supported yet; give a directory that the driver and "
                             "every executor see at the same path (a shared mount)")
        return v


class WarehouseSpec(_Strict):
    engine: Literal["duckdb", "spark"] = Field("duckdb", description="Warehouse engine.")
    path: Path = Field(description="DuckDB database file, relative to the spec file; with engine spark it "
                                   "holds only the control plane (generations, fences, pointers, catalog).")
    spark: SparkSpec | None = Field(None, description="Required when engine is spark.")
    memory_limit: str | None = Field(None, description="DuckDB memory_limit, e.g. '4GB'; spills past it.")
    threads: int | None = Field(None, ge=1, description="DuckDB worker threads.")
    busy_timeout_s: float = Field(300.0, gt=0, description="How long to retry a locked warehouse file.")

    @model_validator(mode="after")
    def _spark_section(self) -> "WarehouseSpec":
        if self.engine == "spark" and self.spark is None:
            raise ValueError("engine is 'spark' but the spark section is missing; add "
                             "spark: {data_path: <dir for Parquet data>, master: local[2]}")
        if self.engine == "duckdb" and self.spark is not None:
            raise ValueError("a spark section is given but engine is 'duckdb'; set engine: spark or remove it")
        return self


class SourceSpec(_Strict):
    table: str = Field(description="The authoritative append-only change log, schema.table.")
    key: list[str] = Field(description="Stable key columns; the target uses the same names.")
    version: str = Field(description="Column whose value increases per key with each change.")
    op: str = Field(description="Column holding the change kind.")
    ingested_at: str = Field(description="Column holding when the change entered the source.")
    upsert_ops: list[str] = Field(["upsert"], description="Values of `op` meaning insert or update.")
    delete_ops: list[str] = Field(["delete"], description="Values of `op` meaning a tombstone.")
    sensitive: list[str] = Field([], description="Columns held only as keyed hashes in evidence.")
    available_from: date | None = Field(
        None, description="Earliest partition for which the source holds authoritative rows."
    )

    @field_validator("table")
    @classmethod
    def _table(cls, v: str) -> str:
        return str(TableName.parse(v))

    @field_validator("key")
    @classmethod
    def _key(cls, v: list[str]) -> list[str]:
        return _idents(v)

    @field_validator("version", "op", "ingested_at")
    @classmethod
    def _cols(cls, v: str) -> str:
        return _ident(v)

    @field_validator("sensitive")
    @classmethod
    def _sens(cls, v: list[str]) -> list[str]:
        return [_ident(x) for x in v]

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

    @field_validator("table")
    @classmethod
    def _table(cls, v: str) -> str:
        return str(TableName.parse(v))

    @field_validator("generation", "started_at")
    @classmethod
    def _cols(cls, v: str) -> str:
        return _ident(v)

    @field_validator("kind", "ended_at", "source_watermark")
    @classmethod
    def _opt(cls, v: str | None) -> str | None:
        return v if v is None else _ident(v)

    @property
    def table_name(self) -> TableName:
        return TableName.parse(self.table)


class Materiality(_Strict):
    column: str
    abs: float | None = Field(None, ge=0, description="A change is material when |diff| >= abs.")
    rel: float | None = Field(None, ge=0, description="...or when |diff| / |original| >= rel.")

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


class ExpectationSpec(_Strict):
    type: str = Field(description="A Great Expectations expectation, snake_case, e.g. expect_column_values_to_be_between.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Its arguments, e.g. {column: amount_usd, min_value: 0}.")

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
    sql: str = Field(description="One SELECT returning the violating rows of {{ rows }} (the backfilled partitions of the "
                                 "new generation); it may also read {{ generation }} (all its rows) and {{ source_latest }} "
                                 "(each key's latest source change as of the backfill's watermark, tombstones included).")
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
    required: int = Field(ge=1, description="Approvals this rule requires when it applies.")
    rows_over: int | None = Field(None, ge=0, description="Applies when the scope's estimated rows exceed this.")
    partitions_over: int | None = Field(None, ge=0, description="Applies when the scope has more partitions than this.")
    consumer_kinds: list[ConsumerKind] = Field([], description="Applies when a consumer of one of these kinds reads the scope.")


class ApprovalPolicy(_Strict):
    approvers: list[str] = Field([], description="Who may approve a backfill of this dataset; empty: anyone named.")
    rules: list[ApprovalRule] = Field(default_factory=lambda: [ApprovalRule(required=1)],
                                      description="The required approvals are the largest `required` of the rules that apply.")


class CapacityLimits(_Strict):
    max_rows: int | None = Field(None, ge=1, description="Refuse a backfill estimated to write more rows than this.")
    max_bytes: int | None = Field(None, ge=1, description="Refuse a backfill whose new generation is estimated larger.")
    max_partitions: int | None = Field(None, ge=1, description="Refuse a backfill over more partitions than this.")
    free_disk_factor: float = Field(2.0, ge=1, description="Free disk must hold this many times the estimated bytes.")
    rows_per_second: float = Field(200_000, gt=0, description="Throughput assumed for the run-time estimate without history.")


class ColumnThresholds(_Strict):
    """Per-column overrides of the value gate's defaults (``recurrence.anomaly.columns.<column>``)."""

    max_changed_share: float | None = Field(None, ge=0, le=1, description="Share of keys whose value may change undeclared.")
    max_mean_shift: float | None = Field(None, ge=0, description="Largest shift of a partition's mean, in published std devs.")
    max_quantile_shift: float | None = Field(None, ge=0, description="Largest shift of p10/p50/p90, in published std devs.")
    max_null_share_change: float | None = Field(None, ge=0, le=1, description="Largest change of the null share.")
    max_distinct_change: float | None = Field(None, ge=0, description="Largest relative change of the distinct count.")
    ignore: bool = Field(False, description="Leave the column out of the value gate (e.g. a load timestamp).")


class AnomalyThresholds(_Strict):
    max_row_change: float = Field(0.05, ge=0, description="Largest relative change of a partition's row count vs published.")
    max_total_change: float = Field(0.05, ge=0, description="Largest relative change of a partition's amount total vs published.")
    history_factor: float = Field(3.0, gt=1, description="A partition's rows or total beyond this factor of the median of "
                                                         "the published partitions (history) is an anomaly.")
    # the value gate: key by key and column by column against the published rows (no per-column setup needed)
    max_changed_share: float = Field(0.2, ge=0, le=1, description="Largest share of the range's keys whose value of one "
                                                                  "column may change without being declared (expect_change).")
    max_missing_keys_share: float = Field(0.05, ge=0, le=1, description="Largest share of published keys the backfill may drop.")
    max_new_keys_share: float = Field(0.05, ge=0, le=1, description="Largest share of keys the backfill may add.")
    max_mean_shift: float = Field(0.5, ge=0, description="Largest shift of a partition's column mean, in published std devs.")
    max_quantile_shift: float = Field(0.5, ge=0, description="Largest shift of a partition's p10/p50/p90, in published std devs.")
    max_null_share_change: float = Field(0.05, ge=0, le=1, description="Largest change of a partition's null share.")
    max_distinct_change: float = Field(0.25, ge=0, description="Largest relative change of a partition's distinct count.")
    min_baseline_rows: int = Field(20, ge=1, description="A partition with fewer published rows is profiled against the "
                                                         "published history (the partitions outside the range) instead.")
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
    current_partitions: int = Field(2, ge=1, description="The latest partitions normal ingestion writes count as current: "
                                                         "a backfill reaching them is flagged and refused unless acknowledged.")

    @model_validator(mode="after")
    def _unique(self):
        names = [i.name for i in self.invariants]
        if len(set(names)) != len(names):
            raise ValueError("recurrence.invariants: two invariants share a name")
        return self


class DatasetSpec(_Strict):
    """A validated dataset spec, with its file paths resolved and its SQL loaded."""

    dataset: str
    warehouse: WarehouseSpec
    source: SourceSpec
    target: TargetSpec
    downstream: list[DownstreamSpec] = []
    suites: list[SuiteSpec] = Field(default_factory=list, description="Great Expectations suites every repair must pass.")
    registry: RegistrySpec | None = Field(None, description="The team's own run registry, for targets this package "
                                                            "did not write (see README, generation registry).")
    recurrence: RecurrenceSpec | None = Field(None, description="Guarded-backfill policy: approvals, capacity, anomaly "
                                                                "thresholds, invariants (defaults apply when absent).")
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
        suites = [x.name for x in self.suites]
        if len(set(suites)) != len(suites):
            raise ValueError("suites: two suites share a name")
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
    def fingerprint(self) -> str:
        """Hash of the spec and its SQL: recorded as a generation's config hash."""
        exclude = {"spec_path"} | {k for k in ("recurrence", "registry") if getattr(self, k) is None}  # unchanged for older specs
        h = hashlib.sha256(self.model_dump_json(exclude=exclude).encode())
        h.update(self.transform_sql.encode())
        for name in sorted(self.downstream_sql):
            h.update(self.downstream_sql[name].encode())
        return h.hexdigest()[:16]


_FIXES = {
    "missing": "add the field",
    "extra_forbidden": "remove it, or check its spelling against the spec reference in README.md",
    "literal_error": "use one of the allowed values",
    "string_type": "give a string",
    "list_type": "give a list, e.g. [a, b]",
    "int_parsing": "give a whole number",
    "float_parsing": "give a number",
    "date_from_datetime_parsing": "give a date as YYYY-MM-DD",
    "date_parsing": "give a date as YYYY-MM-DD",
    "model_type": "give a mapping of fields",
    "greater_than_equal": "give a non-negative value",
    "greater_than": "give a larger value",
}


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "spec"


def _shape_error(err: ValidationError, source: str) -> SpecError:
    first = err.errors()[0]
    field = _loc(tuple(p for p in first["loc"] if not str(p).startswith("function-")))
    msg = first["msg"].removeprefix("Value error, ")
    named = re.match(r"^([a-z_][a-z0-9_.\[\]]*): (.+)$", msg) if field == "spec" else None
    if named:  # a whole-spec check names the field it is about: "downstream: two consumers ..."
        field, msg = named.group(1), named.group(2)
    fix = _FIXES.get(first["type"], "correct the value as the message says")
    if "plain identifier" in msg:
        fix = "use a plain name (letters, digits, underscores); the package quotes it"
    return SpecError(field, msg, fix, source=source)


def load_yaml_model(path: str | Path, model: type[BaseModel], *, what: str, example: str) -> BaseModel:
    """Read a YAML file and validate it as ``model``; every failure is one ``SpecError`` naming
    the field (``what`` when the whole file is at fault) and the fix."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise SpecError(what, f"cannot read the file ({e.strerror})", f"pass the path of an existing {what} YAML")
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SpecError(what, f"not valid YAML ({e})", "fix the YAML syntax", source=source)
    if not isinstance(raw, dict):
        raise SpecError(what, "the file is not a mapping of fields", f"start from {example}", source=source)
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise _shape_error(e, source) from None


def parse_spec(path: str | Path) -> DatasetSpec:
    """Load and validate a spec's shape and files; touches no warehouse."""
    path = Path(path)
    source = str(path)
    spec = load_yaml_model(path, DatasetSpec, what="spec", example="sample_data/transactions/spec.yaml")
    base = path.resolve().parent
    warehouse = spec.warehouse.model_copy(update={"path": (base / spec.warehouse.path).resolve()})
    if warehouse.spark is not None:
        warehouse = warehouse.model_copy(update={"spark": warehouse.spark.model_copy(
            update={"data_path": (base / warehouse.spark.data_path).resolve()})})
    transform = (base / spec.target.transform).resolve()
    transform_sql = _read_sql(transform, "target.transform", "source", source)
    downstream, downstream_sql = [], {}
    for i, d in enumerate(spec.downstream):
        p = (base / d.sql).resolve()
        downstream_sql[d.name] = _read_sql(p, f"downstream[{i}].sql", "target", source)
        downstream.append(d.model_copy(update={"sql": p}))
    target = spec.target.model_copy(update={"transform": transform})
    return spec.model_copy(
        update={
            "warehouse": warehouse,
            "target": target,
            "downstream": downstream,
            "spec_path": path.resolve(),
            "transform_sql": transform_sql,
            "downstream_sql": downstream_sql,
        }
    )


def _read_sql(path: Path, field: str, placeholder: str, source: str) -> str:
    try:
        sql = path.read_text()
    except OSError as e:
        raise SpecError(field, f"cannot read {path} ({e.strerror})", "point it at a readable .sql file, relative to the spec", source=source)
    try:
        check_single_select(sql, placeholder)
    except ValueError as e:
        raise SpecError(field, f"{path.name}: {e}", f"write one SELECT statement that reads {{{{ {placeholder} }}}}", source=source)
    return sql
