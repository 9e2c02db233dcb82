"""Driving the project's Dagster instance from the command line.

The CLI never runs phase logic itself: it launches the same jobs and backfills the
UI launches, against the same instance, so every CLI run shows in the UI. Asset
backfills go through Dagster's own GraphQL mutation (the UI's "Launch backfill"),
and their runs are executed by a real ``dagster-daemon`` in other processes.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import dagster as dg
from dagster._core.execution.backfill import BULK_ACTION_TERMINAL_STATUSES
from dagster._core.storage.dagster_run import IN_PROGRESS_RUN_STATUSES, RunsFilter
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import WorkspaceFileTarget

from recovery import dagster_sqlite
from recovery.config import PROJECT_ROOT
from recovery.lib.errors import GateRefusedError, OutOfOrderError, RecoveryError, RunCrashedError, environment_hint
from recovery.refusal import restore_tracebacks

WORKSPACE = PROJECT_ROOT / "workspace.yaml"
dagster_sqlite.install()  # every process that drives Dagster from here reuses its SQLite connections
logging.getLogger("dagster.code_server").setLevel(logging.WARNING)  # keep CLI output to what the person asked for

LAUNCH_BACKFILL = """
mutation LaunchBackfill($backfillParams: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $backfillParams) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
    ... on UnauthorizedError { message }
    ... on PartitionSetNotFoundError { message }
  }
}
"""


def ensure_dagster_home() -> Path:
    """Use $DAGSTER_HOME, defaulting to the project's git-ignored ``.dagster_home``."""
    home = Path(os.environ.get("DAGSTER_HOME") or PROJECT_ROOT / ".dagster_home").resolve()
    home.mkdir(parents=True, exist_ok=True)
    target = home / "dagster.yaml"
    if not target.exists():
        shutil.copy(PROJECT_ROOT / "dagster.yaml", target)
    os.environ["DAGSTER_HOME"] = str(home)
    return home


def project_instance() -> dg.DagsterInstance:
    ensure_dagster_home()
    return dg.DagsterInstance.get()


def launch_asset_backfill(
    instance: dg.DagsterInstance,
    asset_key: Sequence[str],
    partitions: Sequence[str],
    *,
    tags: dict[str, str],
    title: str,
    description: str = "",
    workspace: Path = WORKSPACE,
    context: WorkspaceProcessContext | None = None,
) -> str:
    """Launch an asset backfill exactly as the UI does; returns the backfill id. Pass an open
    ``context`` (``workspace_context``) to launch several without loading the code location each time."""
    from dagster_graphql.cli import execute_query

    if context is None:
        with workspace_context(instance, workspace) as ctx:
            return launch_asset_backfill(
                instance, asset_key, partitions, tags=tags, title=title, description=description, context=ctx
            )
    params = {
        "assetSelection": [{"path": list(asset_key)}],
        "partitionNames": list(partitions),
        "tags": [{"key": k, "value": v} for k, v in tags.items()],
        "title": title,
        "description": description,
    }
    result = execute_query(context, LAUNCH_BACKFILL, variables={"backfillParams": params})
    payload = (result.get("data") or {}).get("launchPartitionBackfill") or {}
    if payload.get("__typename") != "LaunchBackfillSuccess":
        raise RecoveryError(f"Dagster refused the backfill: {payload.get('message') or result.get('errors')}")
    return payload["backfillId"]


def workspace_context(instance: dg.DagsterInstance, workspace: Path = WORKSPACE) -> WorkspaceProcessContext:
    """The code location as the webserver loads it (a context manager)."""
    return WorkspaceProcessContext(instance, WorkspaceFileTarget(paths=[str(workspace)]))


def backfill_finished(instance: dg.DagsterInstance, backfill_id: str) -> bool:
    backfill = instance.get_backfill(backfill_id)
    if backfill is None or backfill.status not in BULK_ACTION_TERMINAL_STATUSES:
        return False
    active = instance.get_runs(
        RunsFilter(tags={"dagster/backfill": backfill_id}, statuses=list(IN_PROGRESS_RUN_STATUSES))
    )
    return not active


class Daemon:
    """A ``dagster-daemon`` process for the project's instance, stopped on exit; it iterates every
    few seconds, not Dagster's 30 (``recovery.dagster_daemon``), since it is waited on."""

    def __init__(self, workspace: Path = WORKSPACE, log_path: Path | None = None):
        self.workspace = workspace
        self.log_path = log_path or Path(os.environ["DAGSTER_HOME"]) / "daemon.log"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Daemon:
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "recovery.dagster_daemon", "run", "-w", str(self.workspace)],
            cwd=str(PROJECT_ROOT),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self._log.close()

    def wait_until(
        self, done: Callable[[], bool], *, timeout_s: float, on_tick: Callable[[], None] | None = None
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            if self.proc and self.proc.poll() is not None:
                raise RecoveryError(f"dagster-daemon exited with {self.proc.returncode}; see {self.log_path}")
            if time.monotonic() > deadline:
                raise RecoveryError(f"timed out after {timeout_s:.0f}s waiting for Dagster; see {self.log_path}")
            if on_tick:
                on_tick()
            time.sleep(1.0)


def forget_dead_defs_state_storage() -> None:
    """Dagster keeps the state storage of the last entered instance in a context variable; once
    that instance is closed and collected (a long-lived process that opens and closes
    instances: a test session, a notebook), resolving definitions fails on its dead weakref.
    This code location keeps no definitions state, so a dead storage is dropped."""
    from dagster._core.storage.defs_state.base import DefsStateStorage, _current_storage

    storage = DefsStateStorage.get()
    ref = storage._instance_weakref if storage is not None and storage.has_instance else None
    if ref is not None and ref() is None:
        _current_storage.set(None)


def run_job(
    defs: dg.Definitions,
    job_name: str,
    instance: dg.DagsterInstance,
    *,
    partition_key: str | None = None,
    run_config: dict | None = None,
    tags: dict[str, str] | None = None,
) -> dg.ExecuteInProcessResult:
    """Run one of the code location's jobs in this process, recorded in the project's instance."""
    forget_dead_defs_state_storage()
    job = defs.resolve_job_def(job_name)
    # the run's own log (with any trace) is in the instance, shown by the UI; the terminal gets one line
    config = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}, **(run_config or {})}
    try:
        result = job.execute_in_process(
            instance=instance, partition_key=partition_key, run_config=config, tags=tags or {}, raise_on_error=False
        )
    finally:
        restore_tracebacks()  # a step's refusal hid its own stack trace, not this process's later ones
    if not result.success:
        raise run_failure(result, job_name)
    return result


EXPECTED = {
    "RecoveryError",
    "SpecError",
    "OutOfOrderError",
    "FencedGenerationError",
    "SchemaMismatchError",
    "WarehouseBusyError",
}
"""Errors of ours a step raises on purpose: their message is the whole story (exit 2)."""


def _failed_step_error(result: dg.ExecuteInProcessResult):
    for event in result.all_events:
        if event.is_step_failure and event.step_failure_data and event.step_failure_data.error:
            return event.step_failure_data.error
    return None


REFUSAL_KEYS = {"phase", "requires", "missing", "run_first"}
"""The metadata of a phase's refusal to run before the phases it requires (``Refusal.metadata``)."""


def order_refusal(result: dg.ExecuteInProcessResult) -> str | None:
    """The sentence of a step that refused its phase as launched out of order, if one did."""
    for event in result.all_events:
        data = event.step_failure_data if event.is_step_failure else None
        failure = data.user_failure_data if data else None
        if failure is not None and REFUSAL_KEYS <= set(failure.metadata or {}):
            return failure.description
    return None


INPUT_KEYS = {"field", "fix"}
"""The metadata of a step's refusal of its input (an incident missing or invalid: ``SpecError``'s field and fix)."""


def input_refusal(result: dg.ExecuteInProcessResult) -> str | None:
    """The sentence of a step that refused the run's input (nothing was written), if one did."""
    for event in result.all_events:
        data = event.step_failure_data if event.is_step_failure else None
        failure = data.user_failure_data if data else None
        if failure is not None and INPUT_KEYS <= set(failure.metadata or {}):
            return failure.description
    return None


def failed_checks(result: dg.ExecuteInProcessResult) -> list[str]:
    """One sentence per blocking check that failed in the run (its description, else its name)."""
    out = []
    for e in result.all_events:
        if e.event_type_value == "ASSET_CHECK_EVALUATION":
            ev = e.event_specific_data
            if isinstance(ev, dg.AssetCheckEvaluation) and not ev.passed and ev.severity == dg.AssetCheckSeverity.ERROR:
                out.append(f"{ev.asset_key.to_user_string()} {ev.check_name}: {ev.description or 'failed'}")
    return out


def run_failure(result: dg.ExecuteInProcessResult, job_name: str) -> RecoveryError:
    """The failed run as one error a person can act on: our own error's message (exit 2), the
    failed gates' sentences (exit 1), or an unexpected crash whose trace goes to the log (exit 3)."""
    where = f"{job_name} (run {result.run_id})"
    refused = order_refusal(result)
    if refused is not None:  # a phase launched before the phases it requires: its sentence, as the CLI's own
        return OutOfOrderError(refused)
    bad_input = input_refusal(result)
    if bad_input is not None:  # an incident missing or invalid: the field and the fix, exit 2 as the CLI's own
        return RecoveryError(f"{where}: {bad_input}")
    err = _failed_step_error(result)
    chain = []
    while err is not None:
        chain.append(err)
        err = err.cause
    for e in chain:
        if e.cls_name == "GateRefusedError":
            return GateRefusedError(f"{where}: {_message(e)}")
        if e.cls_name in EXPECTED:
            return RecoveryError(f"{where}: {_message(e)}")
    checks = failed_checks(result)
    if checks or any(e.cls_name in ("DagsterAssetCheckFailedError", "Failure") for e in chain):
        reasons = checks or [_message(chain[-1])]
        return GateRefusedError(f"{where} stopped: " + "; ".join(reasons))
    if chain:
        inner = chain[-1]
        said = f"{inner.cls_name}: {_message(inner)}"
        hint = environment_hint(said)
        return RunCrashedError(
            f"{where} {'stopped' if hint else 'crashed'}: {said}" + (f"; {hint}" if hint else ""),
            detail=chain[0].to_string(),
        )
    failures = [e.message or "" for e in result.all_events if e.is_failure]
    return RunCrashedError(
        f"{where} failed: {failures[-1] if failures else 'see the run in the UI'}", detail="\n".join(failures)
    )


def _message(err) -> str:
    msg = (err.message or "").strip()
    prefix = f"{err.cls_name}: "
    while msg.startswith(prefix):
        msg = msg[len(prefix) :]
    return msg.splitlines()[0] if msg else err.cls_name


def failure_reason(result: dg.ExecuteInProcessResult) -> str:
    """The error a person can act on, as text (see ``run_failure``)."""
    return str(run_failure(result, "run"))
