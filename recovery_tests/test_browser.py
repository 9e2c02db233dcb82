"""The UI path, the way a person meets it: headless Chromium drives the Dagster UI.

``dagster-webserver`` serves this code location against a temporary instance (a
copy of the worked example's, so the backfill's runs are there) whose
``dagster.yaml`` names the synchronous run coordinator (Dagster 1.13's default is
the queued one, which needs a daemon): a run launched from the launchpad starts at
once, in a subprocess of the webserver. The browser finds the recovery jobs,
types the incident into ``contain_backfill``'s launchpad, launches it, waits for
the run to succeed, and looks at the asset checks. A second test points the
webserver at the foreign shipments warehouse (``RECOVERY_SPEC``, as a deployed code
location is pointed at a dataset) and, on a new instance, contains it from
``contain_backfill``'s launchpad (the incident typed field by field) and reconciles
it from ``reconcile_incident``'s (a partition picked in the launchpad's picker).
Screenshots go to ``test-artifacts/browser/``.

Chromium is Debian's package (``apt-get install chromium``; ``.ci/run`` installs
it): browsers cannot be downloaded here, so Playwright's Python client launches
that binary. Without it the test is skipped, saying why.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import duckdb
import pytest
import yaml

from recovery.config import PROJECT_ROOT
from recovery.lib.phases import CONTAIN
from recovery_tests.example_build import env as _env

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = PROJECT_ROOT / "test-artifacts" / "browser"
LOCATION = "backfill_recovery"
RECOVERY_JOBS = ("contain_backfill", "preserve_evidence", "assess_incident", "reconcile_incident",
                 "render_incident_timeline", "render_incident_reports")
RECOVERY_ASSETS = (("incident", "reconciliation"), ("incident", "impact"), ("incident", "decision"),
                   ("incident", "timeline"), ("incident", "reports"))
# Runs launch immediately (no QueuedRunCoordinator, which Dagster 1.13 uses by default, so no daemon).
INSTANCE_YAML = {
    "storage": {"sqlite": {"base_dir": {"env": "DAGSTER_HOME"}}},  # the test process reads it with DAGSTER_HOME set too
    "run_coordinator": {"module": "dagster._core.run_coordinator.sync_in_memory_run_coordinator",
                        "class": "SyncInMemoryRunCoordinator"},
    "telemetry": {"enabled": False},
}

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is absent: install Debian's chromium package "
                       "(apt-get install -y chromium; .ci/run does) to run the browser test"),
]


@dataclass(frozen=True)
class Webserver:
    url: str
    home: Path
    spec: Path
    log: Path

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _graphql(url: str, query: str) -> dict:
    req = urllib.request.Request(f"{url}/graphql", data=json.dumps({"query": query}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


LOCATIONS = "{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus locationOrLoadError { __typename } } } } }"


def _wait_for_location(server: Webserver, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"dagster-webserver exited with {proc.returncode}:\n{server.log_tail()}")
        try:
            entries = _graphql(server.url, LOCATIONS)["data"]["workspaceOrError"]["locationEntries"]
            last = entries
            if any(e["name"] == LOCATION and e["loadStatus"] == "LOADED" for e in entries):
                loaded = next(e for e in entries if e["name"] == LOCATION)
                assert loaded["locationOrLoadError"]["__typename"] == "RepositoryLocation", (loaded, server.log_tail())
                return
        except (OSError, KeyError, TypeError, ValueError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"code location {LOCATION} not loaded after {timeout_s:.0f}s ({last}):\n{server.log_tail()}")


@contextmanager
def _serve(home: Path, spec: Path, log: Path) -> Iterator[Webserver]:
    """dagster-webserver on a free localhost port, for the instance in ``home``, serving ``spec``
    (``RECOVERY_SPEC``, the way a deployed code location is pointed at a dataset)."""
    (home / "dagster.yaml").write_text(yaml.safe_dump(INSTANCE_YAML))
    port = _free_port()
    server = Webserver(f"http://127.0.0.1:{port}", home, spec, log)
    environ = {**os.environ, "DAGSTER_HOME": str(home), "RECOVERY_SPEC": str(spec)}
    exe = Path(sys.executable).with_name("dagster-webserver")
    with open(server.log, "ab") as out:
        proc = subprocess.Popen(
            [str(exe), "-w", str(PROJECT_ROOT / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(port)],
            cwd=str(PROJECT_ROOT), env=environ, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        _wait_for_location(server, proc)
        _graphql(server.url, "mutation { setNuxSeen }")  # the community sign-up dialog would cover the page
        yield server
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture
def webserver(failed_example, example_copy: Path, tmp_path: Path):
    """The webserver serving a private copy of the failed example, with a copy of its instance."""
    home = tmp_path / "dagster_home"
    shutil.copytree(failed_example.dagster_home, home, ignore=shutil.ignore_patterns("*.log", "dagster.yaml"))
    with _serve(home, example_copy, tmp_path / "webserver.log") as server:
        yield server


@pytest.fixture
def page():
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            pg = browser.new_page(viewport={"width": 1400, "height": 900})
            pg.set_default_timeout(30_000)
            yield pg
        finally:
            browser.close()


def _shot(pg, name: str) -> None:
    pg.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def _wait_for_run(home: Path, run_id: str, timeout_s: float = 120) -> dg.DagsterRun:
    from dagster._core.instance.ref import InstanceRef

    deadline = time.monotonic() + timeout_s
    with _env(DAGSTER_HOME=str(home)), dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        while time.monotonic() < deadline:
            run = instance.get_run_by_id(run_id)
            if run is not None and run.is_finished:
                if run.status != dg.DagsterRunStatus.SUCCESS:
                    errors = [e.message for e in instance.all_logs(run_id) if e.dagster_event and e.dagster_event.is_failure]
                    raise AssertionError(f"run {run_id} ended {run.status.value}: {errors}")
                return run
            time.sleep(0.5)
    raise AssertionError(f"run {run_id} did not finish in {timeout_s:.0f}s")


def _asset_checks(spec: Path) -> dict[dg.AssetKey, list[tuple[str, bool]]]:
    """Asset checks the code location defines for the spec the webserver serves: (name, blocking) by asset."""
    from recovery.definitions import defs

    with _env(RECOVERY_SPEC=str(spec)):
        graph = defs().resolve_asset_graph()
    by_asset: dict[dg.AssetKey, list[tuple[str, bool]]] = {}
    for k in sorted(graph.asset_check_keys, key=lambda k: (k.asset_key.to_user_string(), k.name)):
        by_asset.setdefault(k.asset_key, []).append((k.name, graph.get_check_spec(k).blocking))
    return by_asset


def test_contain_backfill_is_launched_from_the_launchpad_and_checks_are_visible(webserver: Webserver, page):
    try:
        _walk_the_ui(webserver, page)
    except BaseException:
        _shot(page, "zz-failure")  # what the browser showed when it failed
        raise


def _walk_the_ui(webserver: Webserver, pg) -> None:
    base = webserver.url
    incident_file = webserver.spec.with_name("incident.yaml")

    # 1. the recovery jobs are listed, with the code location
    pg.goto(f"{base}/jobs")
    for job in RECOVERY_JOBS:
        link = pg.locator(f'a[href$="/jobs/{job}"]').first
        link.wait_for()
        assert link.inner_text().strip() == job
    _shot(pg, "01-jobs")

    # 2. contain_backfill's launchpad: the incident typed as run config
    pg.locator('a[href$="/jobs/contain_backfill"]').first.click()
    pg.wait_for_url(re.compile(rf"/locations/{LOCATION}/jobs/contain_backfill"))
    pg.get_by_role("tab", name="Launchpad").click()
    pg.wait_for_url(re.compile(r"/playground"))
    editor = pg.locator(".CodeMirror").first
    editor.wait_for()
    editor.click()
    pg.keyboard.press("Control+A")
    pg.keyboard.press("Delete")
    config = CONTAIN.run_config(str(incident_file))
    pg.keyboard.type(json.dumps(config))  # JSON is YAML in flow style: one line, so the editor's auto-indent is moot
    typed = pg.evaluate("() => document.querySelector('.CodeMirror').CodeMirror.getValue()")
    assert yaml.safe_load(typed) == config, typed
    pg.get_by_text("No errors").wait_for()  # the launchpad validated the config against the job's schema
    _shot(pg, "02-launchpad")

    # 3. launch, then wait for success in the instance and on the run page
    pg.get_by_role("button", name="Launch Run").click()
    pg.wait_for_url(re.compile(r"/runs/[0-9a-f-]{36}"), timeout=60_000)
    run_id = re.search(r"/runs/([0-9a-f-]{36})", pg.url).group(1)
    try:
        run = _wait_for_run(webserver.home, run_id)
    except AssertionError as err:
        _shot(pg, "03-run-failed")
        raise AssertionError(f"{err}\nwebserver log:\n{webserver.log_tail()}") from None
    assert run.job_name == "contain_backfill"
    pg.reload()
    pg.get_by_text("Success", exact=True).first.wait_for(timeout=60_000)
    _shot(pg, "03-run-succeeded")

    # the run really contained the backfill: the generation is fenced in the copy's warehouse
    con = duckdb.connect(str(webserver.spec.with_name("warehouse.duckdb")), read_only=True)
    try:
        fenced = con.execute("SELECT run_id FROM _recovery.timeline WHERE kind LIKE 'containment%' OR kind LIKE 'fence%'").fetchall()
        status = con.execute("SELECT status FROM _recovery.generations WHERE generation = 'backfill-0042'").fetchone()[0]
    finally:
        con.close()
    assert status == "fenced"
    assert fenced, "containment recorded nothing on the timeline"

    # 4. asset checks: every check the code location defines is listed on its asset's Checks tab, and a
    #    blocking one (the repair's gates) says so
    checks = _asset_checks(webserver.spec)
    assert checks, "the code location defines no asset checks (the repair's gates are blocking checks)"
    for asset_key, named in checks.items():
        pg.goto(f"{base}/assets/{'/'.join(asset_key.path)}?view=checks")
        pg.get_by_text(f"Checks ({len(named)})").first.wait_for()
        for name, _ in named:
            pg.get_by_text(name, exact=True).first.wait_for()
        blocking = [name for name, is_blocking in named if is_blocking]
        if blocking:
            pg.get_by_text(blocking[0], exact=True).first.click()
            pg.get_by_text("This is a blocking asset check", exact=False).first.wait_for()
            _shot(pg, f"04-checks-{'-'.join(asset_key.path)}")
    assert any(b for named in checks.values() for _, b in named), "no blocking asset check"
    for key in RECOVERY_ASSETS:
        pg.goto(f"{base}/assets/{'/'.join(key)}")
        pg.get_by_text(key[-1], exact=True).first.wait_for()
    _shot(pg, "05-asset-reports")


# --- the foreign shipments warehouse (issue 14): contain and reconcile through the launchpads -----------------

@pytest.fixture(scope="session")
def shipments(shared_dir: Path) -> Path:
    from recovery_tests.foreign_warehouse import build_shipments

    return build_shipments(shared_dir)


@pytest.fixture
def shipments_webserver(shipments: Path, tmp_path: Path):
    """The webserver pointed at a private copy of the shipments warehouse (``RECOVERY_SPEC``), on a new instance:
    the warehouse's own loads and backfills ran outside Dagster, so there is no Dagster history to copy."""
    from recovery_tests.foreign_warehouse import fresh_copy

    copy = fresh_copy(shipments, tmp_path / "shipments")
    home = tmp_path / "dagster_home"
    home.mkdir()
    with _serve(home, copy / "spec.yaml", tmp_path / "webserver.log") as server:
        yield server


def test_a_foreign_warehouse_is_contained_and_reconciled_from_the_launchpads(shipments_webserver: Webserver, page):
    try:
        _contain_and_reconcile_shipments(shipments_webserver, page)
    except BaseException:
        _shot(page, "zz-shipments-failure")
        raise


def _editor_value(scope) -> str:
    return scope.locator(".CodeMirror").first.evaluate("el => el.CodeMirror.getValue()")


def _type_lines(pg, scope, lines: list[str]) -> None:
    """Type YAML into the (emptied) config editor a line at a time, as a person would. After Enter the editor
    indents the new line by itself; that indentation is taken back first, so each line is typed as written."""
    editor = scope.locator(".CodeMirror").first
    current = "el => { const cm = el.CodeMirror; return cm.getLine(cm.getCursor().line); }"
    for i, line in enumerate(lines):
        if i:
            pg.keyboard.press("Enter")
            for _ in range(40):
                if editor.evaluate(current) == "":
                    break
                pg.keyboard.press("Backspace")
            assert editor.evaluate(current) == "", f"could not clear the auto-indent before {line!r}"
        pg.keyboard.type(line)
    pg.keyboard.press("Control+Home")  # back to the top left, for the screenshot


def _clear_editor(pg, scope) -> None:
    editor = scope.locator(".CodeMirror").first
    editor.wait_for()
    editor.click()
    pg.keyboard.press("Control+A")
    pg.keyboard.press("Delete")
    assert _editor_value(scope) == ""


def _wait_for_run_page(pg, webserver: Webserver, job: str, shot: str) -> dg.DagsterRun:
    run_id = re.search(r"/runs/([0-9a-f-]{36})", pg.url).group(1)
    try:
        run = _wait_for_run(webserver.home, run_id)
    except AssertionError as err:
        _shot(pg, f"{shot}-failed")
        raise AssertionError(f"{err}\nwebserver log:\n{webserver.log_tail()}") from None
    assert run.job_name == job
    pg.reload()
    pg.get_by_text("Success", exact=True).first.wait_for(timeout=60_000)
    pg.get_by_text("Loading run logs").wait_for(state="hidden", timeout=60_000)  # so the screenshot shows them
    _shot(pg, f"{shot}-succeeded")
    return run


def _contain_and_reconcile_shipments(webserver: Webserver, pg) -> None:
    from recovery.defs.reconciliation.partitions import register_target_partitions
    from recovery.lib.spec import parse_spec
    from recovery_tests.foreign_warehouse import labels_vs_truth

    base, spec = webserver.url, webserver.spec
    root = spec.parent
    incident = yaml.safe_load((root / "incident.yaml").read_text())
    assert incident["incident_id"] == "INC-SHIP-7" and incident["failed_generations"] == ["bf-0007"]

    # 1. contain_backfill's launchpad: the incident typed field by field (the spec by its absolute path)
    pg.goto(f"{base}/locations/{LOCATION}/jobs/contain_backfill")
    pg.get_by_role("tab", name="Launchpad").click()
    pg.wait_for_url(re.compile(r"/playground"))
    _clear_editor(pg, pg)
    p = incident["partitions"]
    lines = ["ops:", "  validate_incident:", "    config:",
             f"      incident_id: {incident['incident_id']}",
             f"      spec: {spec}",
             "      failed_generations:", *(f"        - {g}" for g in incident["failed_generations"]),
             "      partitions:", f"        start: '{p['start']}'", f"        end: '{p['end']}'",
             f"      requested_by: {incident['requested_by']}",
             "      approved_by:", *(f"        - {a}" for a in incident["approved_by"])]
    _type_lines(pg, pg, lines)
    typed = _editor_value(pg)
    fields = {k: incident[k] for k in ("incident_id", "failed_generations", "partitions", "requested_by", "approved_by")}
    assert yaml.safe_load(typed) == {"ops": {"validate_incident": {"config": {**fields, "spec": str(spec)}}}}, typed
    pg.get_by_text("No errors").wait_for()  # valid against IncidentConfig's schema
    _shot(pg, "11-shipments-contain-launchpad")
    pg.get_by_role("button", name="Launch Run").click()
    pg.wait_for_url(re.compile(r"/runs/[0-9a-f-]{36}"), timeout=60_000)
    _wait_for_run_page(pg, webserver, "contain_backfill", "12-shipments-contain")

    # the foreign target was adopted (the public name is now a view over the package's first generation)
    # and the backfill's generation is fenced
    con = duckdb.connect(str(root / "warehouse.duckdb"), read_only=True)
    try:
        adopted = con.execute("SELECT count(*) FROM _recovery.timeline WHERE kind = 'target_adopted'").fetchone()[0]
        kind = con.execute("SELECT table_type FROM information_schema.tables WHERE table_schema = 'mart' "
                           "AND table_name = 'shipments'").fetchone()[0]
        status = con.execute("SELECT status FROM _recovery.generations WHERE generation = 'bf-0007'").fetchone()
    finally:
        con.close()
    assert adopted == 1
    assert kind == "VIEW"
    assert status == ("fenced",)

    # 2. reconcile_incident: an asset job over the dynamic `target_partitions`. Its partitions are registered
    #    the way target_partitions_sensor does (no daemon here), before the launchpad lists them.
    from dagster._core.instance.ref import InstanceRef

    with _env(DAGSTER_HOME=str(webserver.home)), dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(webserver.home))) as instance:
        keys = register_target_partitions(instance, parse_spec(spec))
    assert p["start"] in keys and p["end"] in keys, keys
    pg.goto(f"{base}/locations/{LOCATION}/jobs/reconcile_incident")
    # an asset job has no Launchpad tab: its launchpad is behind the arrow beside "Materialize…"
    pg.get_by_role("button", name="Materialize…").wait_for()
    pg.locator('button:has([aria-label="arrow_drop_down"])').first.click()
    pg.get_by_role("menuitem", name="Open launchpad").click()
    dialog = pg.get_by_role("dialog").filter(has_text="Launchpad")
    dialog.wait_for()
    # the partition picker lists the registered partitions; one partition is picked (the asset reconciles
    # every key whatever the partition)
    picker = dialog.get_by_role("combobox").first
    picker.click()
    pg.get_by_role("menuitem", name=p["start"], exact=True).click()
    dialog.get_by_text(f"partition: {p['start']}").first.wait_for()  # the run's dagster/partition tag
    dialog.get_by_text("Generating configuration").wait_for(state="hidden")
    _clear_editor(pg, dialog)
    _type_lines(pg, dialog, ["ops:", "  incident__reconciliation:", "    config:",
                             f"      incident_file: {root / 'incident.yaml'}"])
    typed = _editor_value(dialog)
    assert yaml.safe_load(typed) == {"ops": {"incident__reconciliation": {"config": {"incident_file": str(root / "incident.yaml")}}}}, typed
    dialog.get_by_text("No errors").wait_for()
    _shot(pg, "13-shipments-reconcile-launchpad")
    dialog.get_by_role("button", name="Materialize").click()
    pg.wait_for_url(re.compile(r"/runs/[0-9a-f-]{36}"), timeout=60_000)
    run = _wait_for_run_page(pg, webserver, "reconcile_incident", "14-shipments-reconcile")
    assert run.tags.get("dagster/partition") == p["start"], run.tags

    out = root / "reports" / incident["incident_id"] / "reconciliation.parquet"
    assert out.exists(), f"{out} was not written"
    wrong = labels_vs_truth(out, root)
    assert wrong.empty, wrong.head(20).to_string()
