"""Great Expectations suites over bounded batches.

The engine computes, in SQL, a validation frame with everything an expectation needs
(a key's number of copies across the whole table, the partition the transform
derives from the source row, whether a newer tombstone exists, whether the row's
generation is fenced), and streams it in record batches of a bounded number of rows.
Each batch is validated as a pandas DataFrame by Great Expectations 1.x; results are
summed over batches. Nothing loads the whole table into pandas.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from recovery.lib.dataset_spec.models import DatasetSpec
from recovery.lib.errors import SpecError
from recovery.lib.trace import trace

if TYPE_CHECKING:
    import pyarrow as pa

BATCH_ROWS = 500_000


@dataclass(frozen=True)
class Expectation:
    type: str  # snake_case, e.g. expect_column_values_to_not_be_null
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class Suite:
    name: str
    expectations: tuple[Expectation, ...]
    description: str = ""


@dataclass
class SuiteResult:
    name: str
    rows: int = 0
    batches: int = 0
    failures: dict[str, int] = field(default_factory=dict)  # expectation -> unexpected rows
    samples: dict[str, list] = field(default_factory=dict)
    checked: list[tuple[str, bool, str]] = field(default_factory=list)  # (expectation, passed, observed), when known

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def unexpected(self) -> int:
        return sum(self.failures.values())

    def describe(self) -> str:
        if self.passed:
            return f"{self.name}: passed on {self.rows:,} rows in {self.batches} batch(es)"
        parts = [f"{e} ({n:,} unexpected; e.g. {self.samples.get(e, [])[:3]})" for e, n in self.failures.items()]
        return f"{self.name}: FAILED on {self.rows:,} rows: " + "; ".join(parts)


def _class_name(expectation_type: str) -> str:
    return "".join(part.capitalize() for part in expectation_type.split("_"))


@lru_cache(maxsize=1)
def _gx():
    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import great_expectations as gx
    return gx


def expectation_class(expectation_type: str):
    gx = _gx()
    return getattr(gx.expectations, _class_name(expectation_type), None)


def declared_suites(spec: DatasetSpec, columns: list[str]) -> list[Suite]:
    """The spec's suites, checked against Great Expectations and the target's columns."""
    out = []
    for i, suite in enumerate(spec.suites):
        exps = []
        for j, e in enumerate(suite.expectations):
            field_name = f"suites[{i}].expectations[{j}]"
            cls = expectation_class(e.type)
            if cls is None:
                raise SpecError(
                    f"{field_name}.type",
                    f"{e.type!r} is not a Great Expectations expectation",
                    "use a name from https://greatexpectations.io/expectations (snake_case)",
                )
            for arg in ("column", "column_A", "column_B"):
                if arg in e.kwargs and e.kwargs[arg] not in columns:
                    raise SpecError(
                        f"{field_name}.kwargs.{arg}",
                        f"{e.kwargs[arg]!r} is not a column of {spec.target.table}",
                        f"use one of {columns}",
                    )
            try:
                cls(**e.kwargs)
            except Exception as err:  # GE raises pydantic errors for bad arguments
                raise SpecError(
                    f"{field_name}.kwargs",
                    f"{e.type}: {str(err).splitlines()[0]}",
                    "give the arguments the expectation documents",
                ) from None
            exps.append(Expectation(e.type, dict(e.kwargs)))
        out.append(Suite(suite.name, tuple(exps), description=f"declared in the spec ({len(exps)} expectations)"))
    return out


class SuiteRunner:
    """Validates frames against suites with one ephemeral Great Expectations context."""

    def __init__(self, suites: list[Suite]):
        gx = _gx()
        self.suites = suites
        self.context = gx.get_context(mode="ephemeral")
        try:
            from great_expectations.data_context.types.base import ProgressBarsConfig

            self.context.variables.progress_bars = ProgressBarsConfig(globally=False)
        except Exception:  # progress bars are cosmetic
            pass
        source = self.context.data_sources.add_pandas("recovery")
        self.batch_definition = source.add_dataframe_asset("frame").add_batch_definition_whole_dataframe("batch")
        # one Great Expectations suite holding every expectation, each tagged with its suite:
        # a batch is validated once, whatever the number of suites
        combined = gx.ExpectationSuite(name="recovery_gates")
        for suite in suites:
            for e in suite.expectations:
                combined.add_expectation(expectation_class(e.type)(**e.kwargs, meta={"suite": suite.name}))
        self.combined = self.context.suites.add(combined)
        self.results = {s.name: SuiteResult(s.name) for s in suites}

    def validate(self, frame) -> None:
        if len(frame) == 0:
            return
        t0 = time.perf_counter()
        batch = self.batch_definition.get_batch(batch_parameters={"dataframe": frame})
        res = batch.validate(self.combined)
        trace("great_expectations", time.perf_counter() - t0, f"{len(frame):,} rows x {len(self.suites)} suites")
        for r in self.results.values():
            r.rows += len(frame)
            r.batches += 1
        for er in res.results:
            if er.success:
                continue
            r = self.results[er.expectation_config.meta["suite"]]
            label = er.expectation_config.type + _args(er.expectation_config.kwargs)
            info = er.result or {}
            r.failures[label] = r.failures.get(label, 0) + int(info.get("unexpected_count") or 1)
            r.samples[label] = (
                r.samples.get(label, []) + [_plain(x) for x in (info.get("partial_unexpected_list") or [])]
            )[:5]

    def run(self, batches: Iterable[pa.RecordBatch]) -> dict[str, SuiteResult]:
        for b in batches:
            self.validate(b.to_pandas())
        return self.results


def _args(kwargs: dict) -> str:
    keys = [k for k in ("column", "column_A", "column_B", "column_list") if k in kwargs]
    return "(" + ", ".join(f"{kwargs[k]}" for k in keys) + ")" if keys else ""


def _plain(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if hasattr(x, "item"):
        return x.item()
    return x if isinstance(x, (int, float, str, bool, type(None))) else str(x)
