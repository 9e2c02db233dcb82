"""Great Expectations suites computed by the warehouse: GE's SQL datasource over DuckDB.

Validating pandas batches and summing the results is wrong for every aggregate
expectation (a mean per batch is not the relation's mean, a quantile does not add up,
uniqueness across batches is never checked). Here each expectation is one or a few
SQL queries over the whole relation (any SELECT, e.g. the backfilled partitions of a
candidate generation), run by DuckDB through duckdb-engine and SQLAlchemy; no row goes
through pandas.

Upstream issue worked around: GE 1.x's ``SqlAlchemyExecutionEngine.execute_query``
returns the cursor result *after* handing its connection back to the pool, and
duckdb-engine's rows are gone by then (every expectation fails with
``MetricResolutionError: list index out of range``). ``BufferedExecutionEngine``
overrides that one method to buffer the rows inside the connection
(``result.freeze()()``); ``recovery_tests/lib/repair/test_sql_suites.py`` fails if upstream changes
the method it replaces, so the override is re-examined then.

SQLAlchemy does not open the file again: its connections are the recovery session's own
DuckDB connection (``creator``), so GE reads exactly what the session sees, its
uncommitted writes and temporary tables included (a gate runs inside the transaction
that wrote what it checks; a cursor would be a second connection that sees only what
was committed). The caller owns that transaction: the wrapper's begin, commit, rollback
and close do nothing, so SQLAlchemy's autobegin, its reset-on-return and the pool's
disposal (after each validation) leave it alone. A query GE sends that fails in the
engine aborts the caller's transaction (DuckDB has no savepoints); ``validate`` then
raises, naming the expectation, rather than let the caller write to a dead transaction.
"""

from __future__ import annotations

import time
from functools import lru_cache
from typing import ClassVar, Literal

from recovery.lib.errors import RecoveryError
from recovery.lib.repair.suites import (
    Suite,
    SuiteResult,
    _args,
    _gx,
    _plain,
    expectation_class,
)
from recovery.lib.trace import trace

DATASOURCE_TYPE = "recovery_duckdb"
# GE's BASIC result holds what a gate reports (element and unexpected counts, the partial unexpected
# list, the observed value); its default, SUMMARY, also counts each unexpected value, one more query
# and metric graph per expectation that nothing reads.
RESULT_FORMAT = "BASIC"


@lru_cache(maxsize=1)
def engine_classes() -> tuple[type, type]:
    """(BufferedExecutionEngine, WarehouseDatasource), defined on first use: importing GE costs seconds."""
    _gx()
    from great_expectations.datasource.fluent import SQLDatasource
    from great_expectations.execution_engine import SqlAlchemyExecutionEngine

    class BufferedExecutionEngine(SqlAlchemyExecutionEngine):
        """``execute_query`` with the rows read while the connection is still checked out."""

        def execute_query(self, query):
            with self.get_connection() as connection:
                return self._execute_query_with_recovery(connection, query).freeze()()

    class WarehouseDatasource(SQLDatasource):
        """GE's SQL datasource, running on ``BufferedExecutionEngine``."""

        # GE tells datasource classes apart by this literal: a subclass must narrow the base's "sql"
        type: Literal["recovery_duckdb"] = DATASOURCE_TYPE  # type: ignore[assignment]
        execution_engine_override: ClassVar = BufferedExecutionEngine

    return BufferedExecutionEngine, WarehouseDatasource


@lru_cache(maxsize=1)
def _caller_transaction_class() -> type:
    from duckdb_engine import ConnectionWrapper

    class CallerTransaction(ConnectionWrapper):
        """The session's connection as SQLAlchemy's DBAPI connection, its transaction left to the caller."""

        def begin(self) -> None:
            pass

        def commit(self) -> None:
            pass

        def rollback(self) -> None:
            pass

        def close(self) -> None:
            pass

    return CallerTransaction


def _raised(exception_info: dict | None) -> str | None:
    """The first exception message of an expectation's result (GE nests them per metric), if any."""
    if not exception_info:
        return None
    if exception_info.get("raised_exception"):
        return str(exception_info.get("exception_message") or "error")
    for value in exception_info.values():
        if isinstance(value, dict) and value.get("raised_exception"):
            return str(value.get("exception_message") or "error")
    return None


class SqlSuiteRunner:
    """Validates SQL relations of one DuckDB file against suites, each expectation computed in the engine."""

    def __init__(self, connection, suites: list[Suite]):
        """``connection``: the DuckDB connection of a recovery session (``DuckDBSession.conn``)."""
        gx = _gx()
        engine_classes()
        self.suites = suites
        self.context = gx.get_context(mode="ephemeral")
        try:
            from great_expectations.data_context.types.base import ProgressBarsConfig

            self.context.variables.progress_bars = ProgressBarsConfig(globally=False)
        except Exception:  # noqa: BLE001, S110 (progress bars are cosmetic)
            pass
        wrapper = _caller_transaction_class()
        self.connection = connection
        self.source = getattr(self.context.data_sources, f"add_{DATASOURCE_TYPE}")(
            "warehouse",
            connection_string="duckdb:///:memory:",  # the dialect; connections come from creator
            kwargs={"creator": lambda: wrapper(connection)},
        )
        self._n = 0

    def validate(self, query: str, suites: list[Suite] | None = None) -> dict[str, SuiteResult]:
        """Each suite (default: every suite of the runner) over the whole relation ``query`` (one SELECT)."""
        gx = _gx()
        suites = self.suites if suites is None else suites
        self._n += 1
        combined = gx.ExpectationSuite(name=f"recovery_sql_gates_{self._n}")
        for suite in suites:
            for e in suite.expectations:
                combined.add_expectation(expectation_class(e.type)(**e.kwargs, meta={"suite": suite.name}))
        combined = self.context.suites.add(combined)
        asset = self.source.add_query_asset(f"relation_{self._n}", query=query)
        batch = asset.add_batch_definition_whole_table("whole").get_batch()
        t0 = time.perf_counter()
        try:
            res = batch.validate(combined, result_format=RESULT_FORMAT)
        finally:
            self.source.get_execution_engine().engine.dispose()  # the pool's connections are the session's
        trace("great_expectations_sql", time.perf_counter() - t0, f"{len(combined.expectations)} expectations")
        self._require_live_transaction(res)
        results = {s.name: SuiteResult(s.name, batches=1) for s in suites}
        for er in res.results:
            r = results[er.expectation_config.meta["suite"]]
            info = er.result or {}
            r.rows = max(r.rows, int(info.get("element_count") or 0))
            label = er.expectation_config.type + _args(er.expectation_config.kwargs)
            observed = info.get("observed_value")
            shown = (
                observed
                if observed is not None
                else (f"{info.get('unexpected_count')} unexpected" if info.get("unexpected_count") is not None else "")
            )
            r.checked.append((label, bool(er.success), str(_plain(shown))[:200]))
            if er.success:
                continue
            error = _raised(er.exception_info)
            r.failures[label] = int(info.get("unexpected_count") or 1)
            r.samples[label] = (
                [f"error: {error}"]
                if error
                else [_plain(x) for x in (info.get("partial_unexpected_list") or [])][:5]
                or ([f"observed {_plain(observed)}"] if observed is not None else [])
            )
        return results

    def _require_live_transaction(self, res) -> None:
        """Raise when a query GE sent failed in the engine: the caller's transaction is aborted then."""
        import duckdb

        try:
            self.connection.execute("SELECT 1")
        except duckdb.Error as err:
            broken = [
                er.expectation_config.type + _args(er.expectation_config.kwargs)
                for er in res.results
                if _raised(er.exception_info)
            ]
            raise RecoveryError(
                f"a Great Expectations query failed in the engine ({', '.join(broken) or 'unknown expectation'}), "
                f"which aborted the transaction ({str(err).splitlines()[0]}); nothing was recorded: fix or remove "
                f"that expectation in the spec's suites and rerun"
            ) from err
