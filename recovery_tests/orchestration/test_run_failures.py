"""A Dagster run that fails on the machine (its disk full) stops with one line that says so
and what to do; one that fails on something unexpected says it crashed. Both keep the whole
trace for the log file and exit 3."""

from __future__ import annotations

import errno

import dagster as dg

from recovery.lib.errors import RunCrashedError
from recovery.orchestration import run_failure


@dg.op
def copies_to_a_full_disk():
    raise OSError(errno.ENOSPC, "No space left on device", "/evidence/source/change_log.parquet")


@dg.op
def divides_by_zero():
    return 1 / 0


def _failed(op) -> dg.ExecuteInProcessResult:
    @dg.job(name=f"job_{op.name}")
    def job():
        op()

    with dg.instance_for_test() as instance:
        return job.execute_in_process(instance=instance, raise_on_error=False)


def test_a_full_disk_stops_the_run_with_what_to_do():
    result = _failed(copies_to_a_full_disk)
    err = run_failure(result, "preserve_evidence")
    text = str(err)
    assert err.exit_code == 3 and "\n" not in text
    assert text.startswith(f"preserve_evidence (run {result.run_id}) stopped: OSError:")
    assert "No space left on device" in text and "the disk is full" in text and "run the command again" in text
    assert isinstance(err, RunCrashedError)
    assert "copies_to_a_full_disk" in err.detail  # the trace, for the log file


def test_an_unexpected_failure_says_it_crashed_without_a_hint():
    err = run_failure(_failed(divides_by_zero), "publish_repair")
    assert err.exit_code == 3 and " crashed: ZeroDivisionError" in str(err)
    assert "the disk is full" not in str(err) and "memory_limit" not in str(err)
