"""The notifier's promises: each channel delivers what it says (a log record, a JSON line in
an owner-only file, a JSON POST), an alert is delivered once per key even across notifier
instances (keys kept in the control plane, each delivery a timeline event), and a channel
that fails within its timeout leaves the alert undelivered so the next try delivers it."""

from __future__ import annotations

import json
import logging
import stat
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from recovery.defs.alerts.resources import ALERTS_FILE, NotifierResource, notifier_resource
from recovery.lib.control.plane import SCHEMA, ensure_control_plane
from recovery.lib.engine import DuckDBEngine
from recovery.lib.errors import RecoveryError
from recovery.lib.notify import FileChannel, LogChannel, NotificationError, Notifier, WebhookChannel


@pytest.fixture
def engine(tmp_path: Path) -> DuckDBEngine:
    eng = DuckDBEngine(str(tmp_path / "wh.duckdb"))
    with eng.transaction() as s:
        ensure_control_plane(s)
    return eng


def _alert(n: Notifier, key: str = "k1", **kw) -> bool:
    return n.notify("data-platform-oncall", "write refused", "backfill-0042 tried to write", "critical", key, **kw)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_file_channel_appends_one_json_line_per_alert_readable_by_its_owner_only(tmp_path, engine):
    path = tmp_path / "alerts" / "alerts.jsonl"
    n = Notifier(FileChannel(path), engine)
    assert _alert(n, "k1", incident_id="INC-1") is True
    assert _alert(n, "k2") is True
    lines = _lines(path)
    assert [a["dedupe_key"] for a in lines] == ["k1", "k2"]
    assert lines[0] | {"created_at": None} == {
        "owner": "data-platform-oncall",
        "subject": "write refused",
        "body": "backfill-0042 tried to write",
        "severity": "critical",
        "dedupe_key": "k1",
        "incident_id": "INC-1",
        "created_at": None,
    }
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_same_key_is_delivered_once_even_by_a_new_notifier_and_each_delivery_is_on_the_timeline(tmp_path, engine):
    path = tmp_path / "alerts.jsonl"
    assert _alert(Notifier(FileChannel(path), engine), incident_id="INC-1") is True
    # a new notifier, as after a daemon restart: the key lives in the control plane
    again = Notifier(FileChannel(path), engine)
    assert _alert(again, incident_id="INC-1") is False
    assert _alert(again, incident_id="INC-1") is False
    assert len(_lines(path)) == 1
    with engine.session(read_only=True) as s:
        assert s.fetchall(f"SELECT dedupe_key, channel, incident_id FROM {SCHEMA}.notifications") == [
            ("k1", "file", "INC-1")
        ]
        events = s.fetchall(f"SELECT kind, incident_id, actor FROM {SCHEMA}.timeline WHERE kind = 'alert'")
    assert events == [("alert", "INC-1", "file")]


def test_without_a_warehouse_keys_are_remembered_for_the_notifier_lifetime(tmp_path):
    path = tmp_path / "alerts.jsonl"
    n = Notifier(FileChannel(path))
    assert [_alert(n), _alert(n), _alert(n, "k2")] == [True, False, True]
    assert len(_lines(path)) == 2


def test_log_channel_logs_the_alert(engine, caplog):
    with caplog.at_level(logging.WARNING, logger="recovery.alerts"):
        assert _alert(Notifier(LogChannel(), engine)) is True
    assert any("write refused" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)


class _Hook(BaseHTTPRequestHandler):
    received: list = []
    status = 200
    delay = 0.0

    def do_POST(self):  # noqa: N802 (http.server's naming)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(type(self).delay)
        type(self).received.append((self.headers["Content-Type"], json.loads(body)))
        self.send_response(type(self).status)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def webhook():
    handler = type("Hook", (_Hook,), {"received": [], "status": 200, "delay": 0.0})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield handler, f"http://127.0.0.1:{server.server_port}/alerts"
    server.shutdown()
    server.server_close()


def test_webhook_posts_the_alert_as_json_once(engine, webhook):
    handler, url = webhook
    n = Notifier(WebhookChannel(url, timeout_s=5), engine)
    assert _alert(n, incident_id="INC-1") is True
    assert _alert(n, incident_id="INC-1") is False
    assert len(handler.received) == 1
    content_type, payload = handler.received[0]
    assert content_type == "application/json"
    assert payload["dedupe_key"] == "k1" and payload["severity"] == "critical" and payload["incident_id"] == "INC-1"


def test_a_failing_webhook_raises_and_the_alert_is_delivered_on_the_next_try(engine, webhook):
    handler, url = webhook
    handler.status = 500
    n = Notifier(WebhookChannel(url, timeout_s=5), engine)
    with pytest.raises(NotificationError, match="HTTP 500"):
        _alert(n)
    handler.status = 200
    assert _alert(n) is True
    assert len(handler.received) == 2  # the refused delivery, then the accepted one
    with engine.session(read_only=True) as s:
        assert s.scalar(f"SELECT count(*) FROM {SCHEMA}.notifications") == 1


def test_a_slow_webhook_fails_within_its_timeout(engine, webhook):
    handler, url = webhook
    handler.delay = 3.0
    n = Notifier(WebhookChannel(url, timeout_s=0.5), engine)
    started = time.monotonic()
    with pytest.raises(NotificationError, match="did not accept"):
        _alert(n)
    assert time.monotonic() - started < 2.5
    assert n.already_delivered("k1") is False


def test_an_unreachable_or_malformed_webhook_is_a_clear_error(engine):
    with pytest.raises(NotificationError, match="must start with http"):
        WebhookChannel("file:///etc/passwd")
    n = Notifier(WebhookChannel("http://127.0.0.1:9/alerts", timeout_s=1), engine)
    with pytest.raises(NotificationError, match="did not accept"):
        _alert(n)


def test_notifier_resource_builds_each_channel_and_defaults_to_a_file_in_the_dagster_home(tmp_path, monkeypatch):
    assert isinstance(NotifierResource(kind="file", path=str(tmp_path / "a.jsonl")).channel(), FileChannel)
    assert isinstance(NotifierResource(kind="webhook", url="http://127.0.0.1:1/x").channel(), WebhookChannel)
    assert isinstance(NotifierResource().channel(), LogChannel)
    with pytest.raises(RecoveryError, match="needs a path"):
        NotifierResource(kind="file").channel()
    with pytest.raises(RecoveryError, match="needs a url"):
        NotifierResource(kind="webhook").channel()

    monkeypatch.delenv("RECOVERY_ALERT_WEBHOOK", raising=False)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    assert notifier_resource().path == str(tmp_path / ALERTS_FILE)
    monkeypatch.setenv("RECOVERY_ALERT_WEBHOOK", "https://hooks.example.invalid/x")
    assert notifier_resource().kind == "webhook"
    monkeypatch.delenv("RECOVERY_ALERT_WEBHOOK")
    monkeypatch.delenv("DAGSTER_HOME")
    assert notifier_resource().kind == "log"
