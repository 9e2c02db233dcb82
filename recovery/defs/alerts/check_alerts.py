"""Failed asset checks, read from Dagster's event log, as alerts with a link to their run.

Every check of the code location counts (repair gates, restatement, convergence,
and any added later): an evaluation that did not pass is alerted on when its
severity is ERROR or its check is blocking. The alert's dedupe key names the
check, the run and the partition, so one evaluation is one alert whatever the
number of ticks that see it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import dagster as dg
from dagster._core.definitions.assets.graph.base_asset_graph import BaseAssetGraph
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

from recovery.lib.notify import Severity

UI_URL_ENV = "RECOVERY_UI_URL"
DEFAULT_UI_URL = "http://127.0.0.1:3000"
DEFAULT_OWNER = "data-platform-oncall"
HISTORY_PER_CHECK = 25


def ui_url() -> str:
    return os.environ.get(UI_URL_ENV, DEFAULT_UI_URL).rstrip("/")


@dataclass(frozen=True)
class FailedCheck:
    key: dg.AssetCheckKey
    record_id: int
    run_id: str
    severity: str
    blocking: bool
    description: str | None
    partition: str | None
    owner: str

    @property
    def name(self) -> str:
        return f"{self.key.asset_key.to_user_string()}:{self.key.name}"

    @property
    def dedupe_key(self) -> str:
        return f"asset-check:{self.name}:{self.run_id}:{self.partition or ''}"

    def run_url(self, base: str | None = None) -> str:
        return f"{base or ui_url()}/runs/{self.run_id}"

    def alert(self, base: str | None = None) -> tuple[str, str, Severity]:
        """(subject, body, notifier severity)."""
        kind = "blocking " if self.blocking else ""
        subject = f"{kind}{self.severity} check failed: {self.name}" + (
            f" [{self.partition}]" if self.partition else ""
        )
        body = "\n".join(
            [
                f"Asset check {self.key.name} on {self.key.asset_key.to_user_string()} did not pass"
                + (f" for partition {self.partition}" if self.partition else "")
                + ".",
                self.description or "(no description)",
                f"Run: {self.run_url(base)}",
            ]
        )
        return subject, body, ("critical" if self.severity == "ERROR" else "warning")


def _owner(graph: BaseAssetGraph, asset_key: dg.AssetKey) -> str:
    if graph.has(asset_key):
        for o in graph.get(asset_key).owners:
            return o.removeprefix("team:")
    return DEFAULT_OWNER


def failed_checks(instance: dg.DagsterInstance, graph: BaseAssetGraph, after_id: int = 0) -> list[FailedCheck]:
    """Failed ERROR or blocking evaluations with a record id above ``after_id``, oldest first."""
    found = []
    storage = instance.event_log_storage
    for key in sorted(graph.asset_check_keys, key=lambda k: (k.asset_key.to_user_string(), k.name)):
        records = storage.get_asset_check_execution_history(
            key, limit=HISTORY_PER_CHECK, status={AssetCheckExecutionRecordStatus.FAILED}
        )
        for rec in records:
            evaluation = rec.event.asset_check_evaluation if rec.event else None
            if rec.id <= after_id or evaluation is None or evaluation.passed:
                continue
            blocking = bool(evaluation.blocking)
            if evaluation.severity != dg.AssetCheckSeverity.ERROR and not blocking:
                continue
            found.append(
                FailedCheck(
                    key=key,
                    record_id=rec.id,
                    run_id=rec.run_id,
                    severity=evaluation.severity.value,
                    blocking=blocking,
                    description=evaluation.description,
                    partition=evaluation.partition,
                    owner=_owner(graph, key.asset_key),
                )
            )
    return sorted(found, key=lambda f: f.record_id)
