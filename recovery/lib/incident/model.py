"""The incident file: what failed, who asked, who approved, and which spec it concerns.

Like the spec, it is validated in two stages before anything writes: its shape
(pydantic) and its meaning against the control plane and the target (through a
read-only session): every failed generation must be known (registered, or present
in the target's generation column, as when another tool wrote it) and be a
backfill, and the partition range must overlap the data.
"""

from __future__ import annotations

import re
from datetime import date
from pathlib import Path

import duckdb
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from recovery.lib.catalog_checks import is_numeric_type, load_spec
from recovery.lib.control.write_registry import registered_generations
from recovery.lib.dataset_spec.loader import load_yaml_model, resolve_path, validation_error
from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.engine import open_engine
from recovery.lib.errors import SpecError
from recovery.lib.identifiers import check_identifier, quote

PartitionValue = date | int | str
"""A partition in the partition column's own type and format: a date, an integer, '2013-02'."""


class PartitionRange(BaseModel):
    """The failed backfill's nominal range, in the partition column's own type; checked against
    the column (``check_incident``) and compared there, by the engine, in that type."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    start: PartitionValue = Field(description="First partition of the range, e.g. 2024-01-01, '2013-02' or 201302.")
    end: PartitionValue = Field(description="Last partition of the range, inclusive.")

    @field_validator("start", "end", mode="before")
    @classmethod
    def _not_bool(cls, v: object) -> object:
        if isinstance(v, bool):  # pydantic would read true as the integer partition 1
            raise ValueError("true/false is not a partition value; give one such as 2024-01-01 or '2013-02'")
        return v

    @field_validator("start", "end")
    @classmethod
    def _plain(cls, v: PartitionValue) -> PartitionValue:
        if isinstance(v, str) and (not v.strip() or len(v) > 100 or "\x00" in v):
            raise ValueError("give a partition value such as 2024-01-01 or '2013-02'")
        return v

    @model_validator(mode="after")
    def _ordered(self) -> PartitionRange:
        start, end = self.start, self.end  # strings are ordered in the column's type, by the catalog check
        backwards = type(start) is type(end) and (
            (isinstance(start, int) and isinstance(end, int) and end < start)
            or (isinstance(start, date) and isinstance(end, date) and end < start)
        )
        if backwards:
            raise ValueError("end is before start")
        return self


class Incident(BaseModel):
    """An incident file, with ``spec`` resolved relative to it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    incident_id: str = Field(min_length=1, max_length=100, description="Incident id, e.g. INC-2024-031.")
    spec: Path = Field(description="Dataset spec, relative to the incident file.")
    failed_generations: list[str] = Field(
        default_factory=list,
        description="Generations to fence and repair: the stamps the target's rows carry (a run id, "
        "backfill-<id>, a load id); may be empty when dagster_backfill names the failed backfill.",
    )
    dagster_backfill: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="The failed Dagster backfill's id: every run of it, and whatever its rows carry, is one "
        "failed subject (resolved through the Dagster instance when the incident is loaded).",
    )
    partitions: PartitionRange | None = Field(None, description="Nominal range; inferred from the writes if absent.")
    requested_by: str = Field(min_length=1, description="Who asked for the recovery.")
    approved_by: list[str] = Field(default_factory=list, description="Who approved it.")
    notes: str = ""
    evidence_root: Path | None = Field(
        None, description="Where evidence bundles go (default: evidence/ beside the warehouse)."
    )
    incident_path: Path | None = Field(None, exclude=True)
    subject_generations: tuple[str, ...] = Field(default=(), exclude=True)
    """Generations the Dagster backfill was resolved to: accepted even when they wrote nothing."""
    fence_aliases: tuple[str, ...] = Field(default=(), exclude=True)
    """Stamps only future writes could carry (``backfill-<id>`` of the IO manager): fenced, never reconciled."""

    @field_validator("incident_id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not all(ch.isalnum() or ch in "-_." for ch in v) or v.startswith("."):
            raise ValueError("use letters, digits, '-', '_' and '.' only (it names folders)")
        return v

    @field_validator("failed_generations")
    @classmethod
    def _gens(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("lists a generation twice")
        for g in v:
            if not g or len(g) > 200:
                raise ValueError(f"{g!r} is not a generation id")
        return v

    @model_validator(mode="after")
    def _subject(self) -> Incident:
        if not self.failed_generations and not self.dagster_backfill:
            raise ValueError("failed_generations: name at least one generation, or the failed dagster_backfill")
        return self

    @property
    def fence_generations(self) -> list[str]:
        """What containment fences: the failed generations and the backfill's aliases."""
        return self.failed_generations + [a for a in self.fence_aliases if a not in self.failed_generations]

    def load_spec(self, *, check_warehouse: bool = True) -> DatasetSpec:
        return load_spec(self.spec, check_warehouse=check_warehouse)

    def evidence_dir(self, spec: DatasetSpec) -> Path:
        root = self.evidence_root or spec.warehouse.path.parent / "evidence"
        return Path(root) / self.incident_id

    def reports_dir(self, spec: DatasetSpec) -> Path:
        return spec.warehouse.path.parent / "reports" / self.incident_id


def parse_incident(path: str | Path) -> Incident:
    path = Path(path)
    inc = load_yaml_model(path, Incident, what="incident", example="sample_data/transactions/incident.yaml")
    base = resolve_path(Path.cwd(), path, "incident", source=str(path)).parent
    spec = resolve_path(base, inc.spec, "spec", source=str(path))
    evidence = resolve_path(base, inc.evidence_root, "evidence_root", source=str(path)) if inc.evidence_root else None
    from recovery.lib.incident.evidence_root import check_evidence_root

    check_evidence_root(evidence, source=str(path))
    return inc.model_copy(update={"spec": spec, "evidence_root": evidence, "incident_path": path.resolve()})


def incident_from_mapping(raw: dict, *, base_dir: Path) -> Incident:
    """The same validation for an incident given as run config (paths relative to ``base_dir``)."""
    try:
        inc = Incident.model_validate({k: v for k, v in raw.items() if v is not None})
    except ValidationError as e:
        raise validation_error(e, "run config") from None
    spec = resolve_path(base_dir, inc.spec, "spec", source="run config")
    evidence = (
        resolve_path(base_dir, inc.evidence_root, "evidence_root", source="run config") if inc.evidence_root else None
    )
    from recovery.lib.incident.evidence_root import check_evidence_root

    check_evidence_root(evidence, source="run config")
    return inc.model_copy(update={"spec": spec, "evidence_root": evidence})


def check_incident(inc: Incident, spec: DatasetSpec | None = None) -> DatasetSpec:
    """Meaning checks against the warehouse (read-only). Returns the validated spec: ``spec`` when the
    caller has just loaded and checked the incident's spec (``inc.load_spec()``), else loaded here."""
    src = str(inc.incident_path) if inc.incident_path else None
    spec = spec if spec is not None else inc.load_spec()

    def fail(field: str, problem: str, fix: str):
        raise SpecError(field, problem, fix, source=src)

    engine = open_engine(spec.warehouse)
    gen_col = quote(check_identifier(spec.target.metadata.generation, "column"))
    with engine.session(read_only=True) as s:
        target_cols = dict(s.columns(spec.target.table_name.sql()))
        if not target_cols:
            fail(
                "spec",
                f"target {spec.target.table} does not exist yet",
                "point the incident at a dataset whose target has data",
            )
        amount = spec.target.amount
        if amount is not None and amount in target_cols and not is_numeric_type(target_cols[amount]):
            # the transform returns a number, but the target another tool wrote holds text: reconcile sums it
            fail(
                "target.amount",
                f"column {amount!r} of {spec.target.table} is {target_cols[amount]}, not a number: totals sum it",
                "name a numeric column of the target, or remove the field",
            )
        if not inc.failed_generations:
            fail(
                "dagster_backfill",
                f"Dagster backfill {inc.dagster_backfill!r} resolved to no generation (no run of it in the Dagster "
                f"instance, none recorded in the warehouse)",
                "set DAGSTER_HOME to the instance that ran the backfill, or name the failed generations",
            )
        registered = registered_generations(s, spec)  # the control plane's and the team's registry
        in_target = set()
        # the target is scanned for its generations only when a failed generation is not registered
        # (a foreign target's run ids): a registered one needs no pass over the target's rows
        unknown = set(inc.failed_generations) - set(registered) - set(inc.subject_generations)
        if spec.target.metadata.generation in target_cols and unknown:
            in_target = {
                r[0]
                for r in s.fetchall(
                    f"SELECT DISTINCT {gen_col} FROM {spec.target.table_name.sql()} WHERE {gen_col} IS NOT NULL"
                )
            }
        for i, g in enumerate(inc.failed_generations):
            if g not in registered and g not in in_target and g not in inc.subject_generations:
                known = sorted(set(registered) | in_target)
                fail(
                    f"failed_generations[{i}]",
                    f"generation {g!r} is unknown to dataset {spec.dataset!r} (known: "
                    f"{', '.join(known[:8]) or 'none'})",
                    "name a generation that wrote the target",
                )
            if registered.get(g) not in (None, "backfill", "unknown"):
                fail(
                    f"failed_generations[{i}]",
                    f"generation {g!r} is an {registered[g]} generation, not a backfill",
                    "fence only the failed backfill's generation; normal ingestion must keep running",
                )
        if inc.partitions:
            _check_range(s, spec, inc.partitions, target_cols[spec.target.partition], fail)
    return spec


def _shape(value: str) -> str:
    """'2013-02' -> '9999-99': what a text partition value looks like, to catch '2013-2' or 'Feb 2013'."""
    return re.sub(r"[A-Za-z]", "a", re.sub(r"[0-9]", "9", value))


# calendar formats a text (or integer) partition column's values may all follow: when every value does,
# a bound must be a real one of them ('2013-13' has the shape of '2013-02' but is no month)
_TEXT_FORMATS = (
    ("%Y-%m-%d", "YYYY-MM-DD"),
    ("%Y-%m", "YYYY-MM"),
    ("%Y%m%d", "YYYYMMDD"),
    ("%Y%m", "YYYYMM"),
    ("%Y/%m/%d", "YYYY/MM/DD"),
    ("%Y/%m", "YYYY/MM"),
    ("%Y-%m-%d %H", "YYYY-MM-DD HH"),
    ("%Y-%m-%dT%H", "YYYY-MM-DDTHH"),
)
_INTEGER_FORMATS = (("%Y%m%d", "YYYYMMDD"), ("%Y%m", "YYYYMM"))
_TEXT_TYPES = ("VARCHAR", "STRING", "TEXT")
_INTEGER_TYPES = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT")


def _value_format(s, part: str, table: str, col_type: str) -> tuple[str, str] | None:
    """The calendar format every partition value of the target follows, if one does: (strptime
    format, how a person writes it). One pass over the distinct values."""
    upper = col_type.upper()
    formats: tuple[tuple[str, str], ...]
    if upper.startswith(_TEXT_TYPES):
        formats = _TEXT_FORMATS
    elif upper in _INTEGER_TYPES:
        formats = _INTEGER_FORMATS
    else:
        return None
    text = f"CAST({part} AS VARCHAR)"
    # the length check keeps '%Y%m' from reading '2013021' as a month: strptime takes 1-digit fields
    checks = ", ".join(
        f"count(*) > 0 AND bool_and(try_strptime(v, '{fmt}') IS NOT NULL AND length(v) = "
        f"length(strftime(try_strptime(v, '{fmt}'), '{fmt}')))"
        for fmt, _ in formats
    )
    # the distinct values (one per partition) come from the engine; the calendar check runs on them in
    # process, in DuckDB's strptime, whatever the warehouse's engine (Spark has no try_strptime)
    values = s.arrow(f"SELECT DISTINCT {text} AS v FROM {table} WHERE {part} IS NOT NULL")
    local = duckdb.connect()
    try:
        local.register("partition_values", values)
        row = local.execute(f"SELECT {checks} FROM partition_values").fetchone()
    finally:
        local.close()
    return next((f for f, ok in zip(formats, row or (), strict=False) if ok), None)


def _check_range(s, spec: DatasetSpec, rng: PartitionRange, col_type: str, fail) -> None:
    """Each bound is a value of the partition column's type (and, for text, of its values' shape and,
    when they all follow a calendar format, a real value of it), the range is ordered in that type,
    and it overlaps the data."""
    part, table = quote(spec.target.partition), spec.target.table_name.sql()
    lo, hi = s.fetchone(f"SELECT min({part}), max({part}) FROM {table}")
    example = lo if lo is not None else "2024-01-01"
    shapes = None
    if col_type.upper().startswith(_TEXT_TYPES):
        shapes = {
            r[0]
            for r in s.fetchall(
                f"SELECT DISTINCT regexp_replace(regexp_replace({part}, '[0-9]', '9', 'g'), '[A-Za-z]', 'a', 'g') "
                f"FROM {table} WHERE {part} IS NOT NULL LIMIT 50"
            )
        }
    value_format = _value_format(s, part, table, col_type)
    for field in ("start", "end"):
        value = getattr(rng, field)
        text = value.isoformat() if isinstance(value, date) else str(value)
        ok = s.scalar(f"SELECT TRY_CAST(? AS {col_type}) IS NOT NULL", [text])
        if not ok or (shapes and _shape(text) not in shapes):
            fail(
                f"partitions.{field}",
                f"{text!r} is not a partition of {spec.target.partition} ({col_type})",
                f"give a value like {str(example)!r}, in the column's own format",
            )
        if value_format and not s.scalar(
            f"SELECT try_strptime(?, '{value_format[0]}') IS NOT NULL AND length(?) = "
            f"length(strftime(try_strptime(?, '{value_format[0]}'), '{value_format[0]}'))",
            [text, text, text],
        ):
            fail(
                f"partitions.{field}",
                f"{text!r} is not a real {value_format[1]} value, the format of every {spec.target.partition} "
                f"({col_type}) in the target",
                f"give an existing date in that format, like {str(example)!r}",
            )
    start, end = (
        getattr(rng, f).isoformat() if isinstance(getattr(rng, f), date) else str(getattr(rng, f))
        for f in ("start", "end")
    )
    before, outside = s.fetchone(
        f"SELECT CAST(? AS {col_type}) < CAST(? AS {col_type}), "
        f"CAST(? AS {col_type}) > max({part}) OR CAST(? AS {col_type}) < min({part}) OR min({part}) IS NULL "
        f"FROM {table}",
        [end, start, start, end],
    )
    if before:
        fail(
            "partitions",
            f"end {end!r} is before start {start!r}",
            "give the first partition as start and the last as end",
        )
    if outside:
        fail(
            "partitions",
            f"range {start}..{end} is outside the data ({lo}..{hi})",
            "give a range that overlaps the target's partitions, or omit it to infer it from the writes",
        )
