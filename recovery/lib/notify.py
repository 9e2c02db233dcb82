"""Alerts to people: one small interface, three channels, each alert delivered once.

A sensor re-evaluates every tick and sees the same refused write or run again and
again, and a daemon restart forgets anything held in memory. So the keys of
delivered alerts live in the control plane (``_recovery.notifications``), beside
the fences they are about, and the delivery of an alert is a timeline event
(kind ``alert``) written in the same transaction as its key.

Delivery is at-least-once: the key is recorded only after the channel accepted
the alert, so a channel that fails is retried on the next tick, and a crash
between the two re-delivers once rather than losing the alert.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from recovery.lib import faults
from recovery.lib.control.plane import SCHEMA, EventSource, control_plane_exists, ensure_control_plane, utcnow
from recovery.lib.control.tables import NOTIFICATIONS, NOTIFICATIONS_DDL
from recovery.lib.engine.base import Engine, Session
from recovery.lib.errors import RecoveryError
from recovery.lib.retry import retrying

Severity = Literal["info", "warning", "critical"]


class NotificationError(RecoveryError):
    """A channel did not accept an alert; it stays undelivered and is retried."""


class Alert(BaseModel):
    model_config = ConfigDict(frozen=True)
    owner: str = Field(description="Who must act: a team or on-call rotation.")
    subject: str
    body: str
    severity: Severity = "warning"
    dedupe_key: str = Field(min_length=1, description="Same key, same alert: delivered once.")
    incident_id: str | None = None
    created_at: datetime = Field(default_factory=utcnow)

    def payload(self) -> dict:
        return self.model_dump(mode="json")


class Channel(Protocol):
    name: str

    def send(self, alert: Alert) -> None: ...


class LogChannel:
    """Alerts as log records (``recovery.alerts``): the default when nothing else is set up."""

    name = "log"

    def __init__(self, logger: logging.Logger | None = None):
        self.logger = logger or logging.getLogger("recovery.alerts")

    def send(self, alert: Alert) -> None:
        level = logging.ERROR if alert.severity == "critical" else logging.WARNING
        self.logger.log(level, "[%s] to %s: %s (%s)", alert.severity, alert.owner, alert.subject, alert.dedupe_key)


class FileChannel:
    """Alerts appended as JSON lines to a file readable only by its owner."""

    name = "file"

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def send(self, alert: Alert) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "a", encoding="utf-8") as f:
                f.write(json.dumps(alert.payload(), sort_keys=True) + "\n")
        except OSError as err:
            raise NotificationError(f"cannot append the alert to {self.path} ({err.strerror})") from err


class WebhookChannel:
    """Alerts POSTed as JSON to a URL (Slack-style incoming webhooks, PagerDuty bridges...)."""

    name = "webhook"

    def __init__(self, url: str, *, timeout_s: float = 5.0):
        if not url.startswith(("http://", "https://")):
            raise NotificationError(f"webhook url {url!r} must start with http:// or https://")
        self.url = url
        self.timeout_s = timeout_s

    def send(self, alert: Alert) -> None:
        body = json.dumps(alert.payload(), sort_keys=True).encode()
        req = urllib.request.Request(self.url, data=body, method="POST", headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                status = resp.status
        except urllib.error.HTTPError as err:
            raise NotificationError(f"webhook {self.url} answered HTTP {err.code}") from err
        except (urllib.error.URLError, TimeoutError, OSError) as err:
            raise NotificationError(
                f"webhook {self.url} did not accept the alert within {self.timeout_s}s ({err})"
            ) from err
        if not 200 <= status < 300:
            raise NotificationError(f"webhook {self.url} answered HTTP {status}")


def delivered_keys(session: Session) -> set[str]:
    """Keys already delivered (empty before the first alert)."""
    if not control_plane_exists(session) or session.object_kind(SCHEMA, "notifications") is None:
        return set()
    return {r[0] for r in session.fetchall(f"SELECT dedupe_key FROM {NOTIFICATIONS}")}


class Notifier:
    """Delivers alerts through one channel, once per dedupe key.

    With an ``engine`` the delivered keys are kept in the control plane (and each
    delivery is a timeline event); without one, only for this object's lifetime.
    """

    def __init__(self, channel: Channel, engine: Engine | None = None):
        self.channel = channel
        self.engine = engine
        self._seen: set[str] = set()

    def already_delivered(self, dedupe_key: str) -> bool:
        if dedupe_key in self._seen:
            return True
        if self.engine is None:
            return False
        with self.engine.session(read_only=True) as s:
            return dedupe_key in delivered_keys(s)

    def notify(
        self,
        owner: str,
        subject: str,
        body: str,
        severity: Severity = "warning",
        dedupe_key: str = "",
        *,
        incident_id: str | None = None,
        dataset: str | None = None,
    ) -> bool:
        """Deliver the alert unless its key was delivered before. True when delivered now."""
        alert = Alert(
            owner=owner,
            subject=subject,
            body=body,
            severity=severity,
            dedupe_key=dedupe_key or f"{owner}:{subject}",
            incident_id=incident_id,
        )
        if self.already_delivered(alert.dedupe_key):
            return False
        self.channel.send(alert)
        faults.checkpoint("notify:sent")  # delivered, its key not recorded: a rerun delivers it again
        self._seen.add(alert.dedupe_key)
        if self.engine is not None:
            self._record(alert, dataset)
            faults.checkpoint("notify:committed")
        return True

    def _record(self, alert: Alert, dataset: str | None) -> None:
        engine = self.engine
        assert engine is not None  # recorded only when the notifier has a warehouse

        def txn() -> None:
            with engine.transaction() as s:
                ensure_control_plane(s)
                s.execute(NOTIFICATIONS_DDL)
                s.execute(
                    f"INSERT INTO {NOTIFICATIONS} VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    [
                        alert.dedupe_key,
                        alert.owner,
                        alert.subject,
                        alert.severity,
                        self.channel.name,
                        alert.incident_id,
                        utcnow(),
                    ],
                )
                EventSource(dataset=dataset, incident_id=alert.incident_id, actor=self.channel.name).record(
                    s,
                    "alert",
                    f"{alert.severity} alert to {alert.owner}: {alert.subject}",
                    {"dedupe_key": alert.dedupe_key, "channel": self.channel.name},
                )
                faults.checkpoint("notify:recorded")  # the key and its event, not committed

        retrying(txn)
