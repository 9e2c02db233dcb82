"""The notifier every sensor alerts through, wired once for the code location.

Default: a JSON-lines file under the Dagster home (``$DAGSTER_HOME/recovery-alerts.jsonl``),
so alerts survive and can be inspected; a webhook when ``RECOVERY_ALERT_WEBHOOK``
names one; the log when there is no Dagster home.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import dagster as dg
from pydantic import Field

from recovery.lib.engine.base import Engine
from recovery.lib.errors import RecoveryError
from recovery.lib.notify import Channel, FileChannel, LogChannel, Notifier, WebhookChannel

ALERTS_FILE = "recovery-alerts.jsonl"


class NotifierResource(dg.ConfigurableResource):
    """Where alerts go. Delivered keys are kept in the warehouse's control plane."""

    kind: Literal["log", "file", "webhook"] = Field(
        default="log", description="Channel: log records, a JSON-lines file, or an HTTP POST of JSON."
    )
    path: str | None = Field(
        default=None, description="File the 'file' channel appends to (created readable by its owner only)."
    )
    url: str | None = Field(default=None, description="URL the 'webhook' channel POSTs each alert to.")
    timeout_s: float = Field(
        default=5.0, description="Webhook timeout in seconds: a slow endpoint must not stall the sensor."
    )

    def channel(self) -> Channel:
        if self.kind == "file":
            if not self.path:
                raise RecoveryError("notifier: kind 'file' needs a path. Fix: set path to the alerts file")
            return FileChannel(self.path)
        if self.kind == "webhook":
            if not self.url:
                raise RecoveryError("notifier: kind 'webhook' needs a url. Fix: set url to the webhook endpoint")
            return WebhookChannel(self.url, timeout_s=self.timeout_s)
        return LogChannel()

    def notifier(self, engine: Engine | None = None) -> Notifier:
        return Notifier(self.channel(), engine)


def notifier_resource() -> NotifierResource:
    url = os.environ.get("RECOVERY_ALERT_WEBHOOK")
    if url:
        return NotifierResource(kind="webhook", url=url)
    home = os.environ.get("DAGSTER_HOME")
    if home:
        return NotifierResource(kind="file", path=str(Path(home) / ALERTS_FILE))
    return NotifierResource(kind="log")


@dg.definitions
def alert_resources() -> dg.Definitions:
    return dg.Definitions(resources={"notifier": notifier_resource()})
