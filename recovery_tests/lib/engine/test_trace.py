"""``RECOVERY_TRACE``: where a long phase spends its engine time, one JSON line per slow step."""

from __future__ import annotations

import json

from bench.recover_bench import summarize_trace
from recovery.lib.engine import DuckDBEngine


def test_statements_over_the_threshold_are_traced_and_nothing_is_written_when_off(tmp_path, monkeypatch):
    engine = DuckDBEngine(str(tmp_path / "w.duckdb"))
    trace = tmp_path / "trace.jsonl"
    monkeypatch.delenv("RECOVERY_TRACE", raising=False)
    with engine.session() as s:
        s.execute("CREATE TABLE t AS SELECT range AS i FROM range(1000)")
    assert not trace.exists()

    monkeypatch.setenv("RECOVERY_TRACE", str(trace))
    monkeypatch.setenv("RECOVERY_TRACE_MIN_S", "0")
    with engine.session() as s:
        assert s.scalar("SELECT   sum(i)\n FROM t") == 499500
        list(s.arrow_batches("SELECT i FROM t", 100))
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    # opening the file and closing it (a writer's close checkpoints) are the engine's time too
    assert [x["kind"] for x in lines if x["kind"] != "sql"] == ["connect", "close"]
    assert {x["what"] for x in lines if x["kind"] != "sql"} == {str(tmp_path / "w.duckdb")}
    assert "SELECT sum(i) FROM t" in [x["what"] for x in lines]  # white space folded
    assert any(x["what"].startswith("-- next batch of: SELECT i FROM t") for x in lines)
    assert all(x["s"] >= 0 for x in lines)

    monkeypatch.setenv("RECOVERY_TRACE_MIN_S", "3600")  # nothing is that slow
    before = trace.read_text()
    with engine.session() as s:
        s.scalar("SELECT count(*) FROM t")
    assert trace.read_text() == before

    summary = summarize_trace(trace, top=2)
    assert set(summary["seconds_per_kind"]) == {"sql", "connect", "close"} and len(summary["slowest"]) == 2
    assert summary["slowest"][0]["s"] >= summary["slowest"][1]["s"]


def test_a_trace_splits_by_the_phase_marks_and_marks_are_not_steps(tmp_path, monkeypatch):
    from recovery.lib.trace import mark, trace

    path = tmp_path / "trace.jsonl"
    monkeypatch.setenv("RECOVERY_TRACE", str(path))
    monkeypatch.setenv("RECOVERY_TRACE_MIN_S", "0")
    trace("sql", 1.0, "SELECT 1")
    mark("phase evidence starts")
    trace("sql", 2.0, "COPY a")
    mark("classification starts")  # not a phase: the steps after it stay in evidence
    trace("great_expectations_sql", 0.5, "3 expectations")
    mark("phase assess starts")
    trace("sql", 4.0, "SELECT 2")
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert all("at" in x for x in lines)
    summary = summarize_trace(path, top=10)
    assert summary["seconds_per_phase"] == {"before the first phase": 1.0, "evidence": 2.5, "assess": 4.0}
    assert summary["seconds_per_kind"] == {"sql": 7.0, "great_expectations_sql": 0.5}
    assert [x["what"] for x in summary["slowest"]] == ["SELECT 2", "COPY a", "SELECT 1", "3 expectations"]
