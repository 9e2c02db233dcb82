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
Screenshots go to ``test-artifacts/browser/``. A third test serves two datasets from the one
code location (the worked example, and the small orders dataset named by ``RECOVERY_SPECS``):
the lineage, the groups' catalogs and the jobs list show both; a guarded backfill launched
from ``guarded_backfill``'s launchpad is refused by a gate, the alert carries the gate's
sentence and the run's link, and the run page it opens shows the sentence and no stack trace
(screenshots in the test's temporary folder). The whole recovery launched from the UI is
``test_browser_recovery``.

Chromium is Debian's package (``apt-get install chromium``; ``.ci/run`` installs
it): browsers cannot be downloaded here, so Playwright's Python client launches
that binary. Without it the test is skipped, saying why.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import dagster as dg
import duckdb
import pytest
import yaml

from recovery.lib.incident.phases import CONTAIN
from recovery_tests.support.browser import (
    CHROMIUM,
    EXAMPLE_LOCATION,
    LOCATION,
    Webserver,
    clear_editor,
    editor_value,
    screenshot,
    serve,
    wait_for_run,
)
from recovery_tests.support.example_build import env as _env
from recovery_tests.support.rows import present

RECOVERY_JOBS = (
    "contain_backfill",
    "preserve_evidence",
    "assess_incident",
    "reconcile_incident",
    "render_incident_timeline",
    "render_incident_reports",
)
RECOVERY_ASSETS = (
    ("incident", "reconciliation"),
    ("incident", "impact"),
    ("incident", "decision"),
    ("incident", "timeline"),
    ("incident", "reports"),
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason=f"{CHROMIUM} is absent: install Debian's chromium package "
        "(apt-get install -y chromium; .ci/run does) to run the browser test",
    ),
]


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
        screenshot(page, "zz-failure")  # what the browser showed when it failed
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
    screenshot(pg, "01-jobs")

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
    screenshot(pg, "02-launchpad")

    # 3. launch, then wait for success in the instance and on the run page
    pg.get_by_role("button", name="Launch Run").click()
    pg.wait_for_url(re.compile(r"/runs/[0-9a-f-]{36}"), timeout=60_000)
    run_id = present(re.search(r"/runs/([0-9a-f-]{36})", pg.url)).group(1)
    try:
        run = wait_for_run(webserver.home, run_id)
    except AssertionError as err:
        screenshot(pg, "03-run-failed")
        raise AssertionError(f"{err}\nwebserver log:\n{webserver.log_tail()}") from None
    assert run.job_name == "contain_backfill"
    pg.reload()
    pg.get_by_text("Success", exact=True).first.wait_for(timeout=60_000)
    screenshot(pg, "03-run-succeeded")

    # the run really contained the backfill: the generation is fenced in the copy's warehouse
    con = duckdb.connect(str(webserver.spec.with_name("warehouse.duckdb")), read_only=True)
    try:
        fenced = con.execute(
            "SELECT run_id FROM _recovery.timeline WHERE kind LIKE 'containment%' OR kind LIKE 'fence%'"
        ).fetchall()
        status = present(
            con.execute("SELECT status FROM _recovery.generations WHERE generation = 'backfill-0042'").fetchone()
        )[0]
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
            screenshot(pg, f"04-checks-{'-'.join(asset_key.path)}")
    assert any(b for named in checks.values() for _, b in named), "no blocking asset check"
    for key in RECOVERY_ASSETS:
        pg.goto(f"{base}/assets/{'/'.join(key)}")
        pg.get_by_text(key[-1], exact=True).first.wait_for()
    screenshot(pg, "05-asset-reports")


# --- the foreign shipments warehouse (issue 14): contain and reconcile through the launchpads -----------------


@pytest.fixture(scope="session")
def shipments(shared_dir: Path) -> Path:
    from recovery_tests.support.foreign_warehouse import build_shipments

    return build_shipments(shared_dir)


@pytest.fixture
def shipments_webserver(shipments: Path, tmp_path: Path):
    """The webserver pointed at a private copy of the shipments warehouse (``RECOVERY_SPEC``), on a new instance:
    the warehouse's own loads and backfills ran outside Dagster, so there is no Dagster history to copy."""
    from recovery_tests.support.foreign_warehouse import fresh_copy

    copy = fresh_copy(shipments, tmp_path / "shipments")
    home = tmp_path / "dagster_home"
    home.mkdir()
    with serve(home, copy / "spec.yaml", tmp_path / "webserver.log") as server:
        yield server


def test_a_foreign_warehouse_is_contained_and_reconciled_from_the_launchpads(shipments_webserver: Webserver, page):
    try:
        _contain_and_reconcile_shipments(shipments_webserver, page)
    except BaseException:
        screenshot(page, "zz-shipments-failure")
        raise


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


def _asset_job_launchpad(pg, base: str, job: str, button: str):
    """An asset job has no Launchpad tab: its launchpad is behind the arrow beside the materialize button."""
    pg.goto(f"{base}/locations/{LOCATION}/jobs/{job}")
    pg.get_by_role("button", name=button).wait_for()
    pg.locator('button:has([aria-label="arrow_drop_down"])').first.click()
    pg.get_by_role("menuitem", name="Open launchpad").click()
    dialog = pg.locator('[role="dialog"][aria-modal="true"]').filter(has_text="Launchpad")  # not the menu popover
    dialog.wait_for()
    return dialog


def _wait_for_run_page(pg, webserver: Webserver, job: str, shot: str) -> dg.DagsterRun:
    run_id = present(re.search(r"/runs/([0-9a-f-]{36})", pg.url)).group(1)
    try:
        run = wait_for_run(webserver.home, run_id)
    except AssertionError as err:
        screenshot(pg, f"{shot}-failed")
        raise AssertionError(f"{err}\nwebserver log:\n{webserver.log_tail()}") from None
    assert run.job_name == job
    pg.reload()
    pg.get_by_text("Success", exact=True).first.wait_for(timeout=60_000)
    pg.get_by_text("Loading run logs").wait_for(state="hidden", timeout=60_000)  # so the screenshot shows them
    screenshot(pg, f"{shot}-succeeded")
    return run


def _contain_and_reconcile_shipments(webserver: Webserver, pg) -> None:
    from recovery.defs.target_partitions import register_target_partitions
    from recovery.lib.dataset_spec.models import parse_spec
    from recovery_tests.support.foreign_warehouse import labels_vs_truth

    base, spec = webserver.url, webserver.spec
    root = spec.parent
    incident = yaml.safe_load((root / "incident.yaml").read_text())
    assert incident["incident_id"] == "INC-SHIP-7" and incident["failed_generations"] == ["bf-0007"]

    # 1. contain_backfill's launchpad: the incident typed field by field (the spec by its absolute path)
    pg.goto(f"{base}/locations/{LOCATION}/jobs/contain_backfill")
    pg.get_by_role("tab", name="Launchpad").click()
    pg.wait_for_url(re.compile(r"/playground"))
    clear_editor(pg, pg)
    p = incident["partitions"]
    lines = [
        "ops:",
        "  validate_incident:",
        "    config:",
        f"      incident_id: {incident['incident_id']}",
        f"      spec: {spec}",
        "      failed_generations:",
        *(f"        - {g}" for g in incident["failed_generations"]),
        "      partitions:",
        f"        start: '{p['start']}'",
        f"        end: '{p['end']}'",
        f"      requested_by: {incident['requested_by']}",
        "      approved_by:",
        *(f"        - {a}" for a in incident["approved_by"]),
    ]
    _type_lines(pg, pg, lines)
    typed = editor_value(pg)
    fields = {
        k: incident[k] for k in ("incident_id", "failed_generations", "partitions", "requested_by", "approved_by")
    }
    assert yaml.safe_load(typed) == {"ops": {"validate_incident": {"config": {**fields, "spec": str(spec)}}}}, typed
    pg.get_by_text("No errors").wait_for()  # valid against IncidentConfig's schema
    screenshot(pg, "11-shipments-contain-launchpad")
    pg.get_by_role("button", name="Launch Run").click()
    pg.wait_for_url(re.compile(r"/runs/[0-9a-f-]{36}"), timeout=60_000)
    _wait_for_run_page(pg, webserver, "contain_backfill", "12-shipments-contain")

    # the foreign target was adopted (the public name is now a view over the package's first generation)
    # and the backfill's generation is fenced
    con = duckdb.connect(str(root / "warehouse.duckdb"), read_only=True)
    try:
        adopted = present(
            con.execute("SELECT count(*) FROM _recovery.timeline WHERE kind = 'target_adopted'").fetchone()
        )[0]
        kind = present(
            con.execute(
                "SELECT table_type FROM information_schema.tables "
                "WHERE table_schema = 'mart' AND table_name = 'shipments'"
            ).fetchone()
        )[0]
        status = con.execute("SELECT status FROM _recovery.generations WHERE generation = 'bf-0007'").fetchone()
    finally:
        con.close()
    assert adopted == 1
    assert kind == "VIEW"
    assert status == ("fenced",)

    # 2. reconcile_incident: an asset job over the dynamic `target_partitions`. Its partitions are registered
    #    the way target_partitions_sensor does (no daemon here), before the launchpad lists them.
    from dagster._core.instance.ref import InstanceRef

    with (
        _env(DAGSTER_HOME=str(webserver.home)),
        dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(webserver.home))) as instance,
    ):
        keys = register_target_partitions(instance, parse_spec(spec))
    assert p["start"] in keys and p["end"] in keys, keys
    dialog = _asset_job_launchpad(pg, base, "reconcile_incident", "Materialize…")
    # the partition picker lists the registered partitions; one partition is picked (the asset reconciles
    # every key whatever the partition)
    picker = dialog.get_by_role("combobox").first
    picker.click()
    pg.get_by_role("menuitem", name=p["start"], exact=True).click()
    dialog.get_by_text(f"partition: {p['start']}").first.wait_for()  # the run's dagster/partition tag
    dialog.get_by_text("Generating configuration").wait_for(state="hidden")
    clear_editor(pg, dialog)
    _type_lines(
        pg,
        dialog,
        ["ops:", "  incident__reconciliation:", "    config:", f"      incident_file: {root / 'incident.yaml'}"],
    )
    typed = editor_value(dialog)
    assert yaml.safe_load(typed) == {
        "ops": {"incident__reconciliation": {"config": {"incident_file": str(root / "incident.yaml")}}}
    }, typed
    dialog.get_by_text("No errors").wait_for()
    screenshot(pg, "13-shipments-reconcile-launchpad")
    dialog.get_by_role("button", name="Materialize").click()
    pg.wait_for_url(re.compile(r"/runs/[0-9a-f-]{36}"), timeout=60_000)
    run = _wait_for_run_page(pg, webserver, "reconcile_incident", "14-shipments-reconcile")
    assert run.tags.get("dagster/partition") == p["start"], run.tags

    out = root / "reports" / incident["incident_id"] / "reconciliation.parquet"
    assert out.exists(), f"{out} was not written"
    wrong = labels_vs_truth(out, root)
    assert wrong.empty, wrong.head(20).to_string()


# --- two datasets in one code location (issue 19): both in the UI, and a refused gate read on its run page ----

REFUSING_RECOMPUTE = "recovery_tests.support.faulty_recomputes:unit_change"  # amounts in cents: the values gate refuses


@pytest.fixture
def two_datasets_webserver(failed_example, tmp_path: Path):
    """One webserver serving the worked example (``RECOVERY_SPEC``; published correctly, so a guarded backfill
    can run on it) and the small orders dataset (composite key, string partitions) in the directory named
    by ``RECOVERY_SPECS``, on a new instance."""
    from recovery_tests.support.recurrence import transactions_dataset
    from recovery_tests.support.small_dataset import build_small_dataset

    example = transactions_dataset(tmp_path, failed_example)
    orders = build_small_dataset(tmp_path / "datasets" / "orders", n_orders=40)
    home = tmp_path / "dagster_home"
    home.mkdir()
    with serve(home, example.spec_path, tmp_path / "webserver.log", specs=orders.parent.parent) as server:
        yield server, example, orders


def test_one_code_location_shows_both_datasets_and_a_refused_gates_reason(two_datasets_webserver, page, tmp_path: Path):
    server, example, orders = two_datasets_webserver
    shots = tmp_path / "screenshots"
    shots.mkdir()
    defs = _location_defs(server)
    try:
        _both_datasets_in_the_ui(server, defs, orders, page, shots)
        _refused_backfill_from_the_launchpad_to_the_alert_and_back(server, defs, example, page, shots, tmp_path)
    except BaseException:
        screenshot(page, "zz-failure", shots)
        raise


def _location_defs(server: Webserver) -> dg.Definitions:
    """The code location as the webserver loads it (the same RECOVERY_SPEC and RECOVERY_SPECS)."""
    from recovery.definitions import defs

    with _env(RECOVERY_SPEC=str(server.spec), RECOVERY_SPECS=str(server.specs or "")):
        return defs()


def _both_datasets_in_the_ui(server: Webserver, defs: dg.Definitions, orders_spec: Path, pg, shots: Path) -> None:
    from recovery.defs.datasets.defs import target_key
    from recovery.example.defs import TARGET_KEY
    from recovery.lib.dataset_spec.models import parse_spec

    base = server.url
    graph = defs.resolve_asset_graph()
    orders = parse_spec(orders_spec).dataset
    assert orders == "orders"
    # each dataset's groups: the worked example's consumers unprefixed, the orders dataset's under its own
    # prefix and group; the example's target is its own code location's (EXAMPLE_LOCATION)
    groups = {"consumers": [], orders: [target_key(parse_spec(orders_spec))]}
    for group in groups:
        members = sorted(k for k in graph.get_all_asset_keys() if graph.get(k).group_name == group)
        assert members, f"the code location has no asset in group {group}"
        assert set(groups[group]) <= set(members), (group, members)
        groups[group] = members
    assert not graph.get(TARGET_KEY).is_materializable  # only the consumers' upstream key in this location
    assert all(k.path[0] == orders for k in groups[orders]) and len(groups[orders]) == 2, groups[orders]

    # 1. the global lineage lists the groups of both datasets
    pg.goto(f"{base}/asset-groups")
    for group in groups:
        pg.get_by_text(group, exact=True).first.wait_for()
    screenshot(pg, "01-lineage-groups", shots)

    # 2. each group's catalog lists its assets by their full key (the orders' under the prefix "orders"; a long
    #    key's label is truncated in the middle, so the row is found by its link to the asset's page)
    for location, group, members in [
        *((LOCATION, group, members) for group, members in groups.items()),
        (EXAMPLE_LOCATION, "example_pipeline", [TARGET_KEY]),
    ]:
        pg.goto(f"{base}/locations/{location}/asset-groups/{group}/list")
        for key in members:
            pg.locator(f'a[href$="/assets/{"/".join(key.path)}"]').first.wait_for()
        screenshot(pg, f"02-catalog-{group}", shots)
    pg.goto(f"{base}/locations/{LOCATION}/asset-groups/{orders}")  # the orders' lineage: target -> consumer
    for key in groups[orders]:
        pg.get_by_text(key.path[-1], exact=True).first.wait_for()
    screenshot(pg, "03-lineage-orders", shots)

    # 3. the jobs list holds both datasets' ingestion and containment jobs
    pg.goto(f"{base}/jobs")
    for job in ("ingest_transactions", "contain_backfill", f"ingest__{orders}", f"contain_backfill__{orders}"):
        link = pg.locator(f'a[href$="/jobs/{job}"]').first
        link.wait_for()
        assert link.inner_text().strip() == job
    screenshot(pg, "04-jobs", shots)


def _refused_backfill_from_the_launchpad_to_the_alert_and_back(
    server: Webserver, defs: dg.Definitions, example, pg, shots: Path, tmp_path: Path
) -> None:
    """A guarded backfill of the worked example with a recompute that changes every amount, launched from
    guarded_backfill's launchpad: its gates refuse it (the values gate among them); the alert sensor's alert
    carries the values gate's sentence and the run's link, and the run page that link opens shows the sentence."""
    from dagster._core.instance.ref import InstanceRef

    from recovery.defs.alerts.resources import NotifierResource
    from recovery.defs.resources import warehouse_resource
    from recovery_tests.support.recurrence import APPROVERS

    base = server.url
    before = example.public_hash()
    config = {
        "ops": {
            "recurrence__backfill": {
                "config": {
                    "start": example.start,
                    "end": example.end,
                    "recompute": REFUSING_RECOMPUTE,
                    "requested_by": "data-platform-oncall",
                    "approved_by": APPROVERS,
                }
            }
        }
    }

    # 1. guarded_backfill's launchpad (an asset job: behind the arrow beside "Materialize all")
    dialog = _asset_job_launchpad(pg, base, "guarded_backfill", "Materialize all")
    dialog.get_by_text("Generating configuration").wait_for(state="hidden")
    clear_editor(pg, dialog)
    pg.keyboard.type(json.dumps(config))  # JSON is YAML in flow style
    assert yaml.safe_load(editor_value(dialog)) == config
    dialog.get_by_text("No errors").wait_for()
    pg.keyboard.press("Control+Home")  # back to the start of the line, for the screenshot
    screenshot(pg, "05-guarded-backfill-launchpad", shots)
    dialog.get_by_role("button", name="Materialize").click()
    pg.wait_for_url(re.compile(r"/runs/[0-9a-f-]{36}"), timeout=60_000)
    run_id = present(re.search(r"/runs/([0-9a-f-]{36})", pg.url)).group(1)
    try:
        run = wait_for_run(server.home, run_id, timeout_s=300, status=dg.DagsterRunStatus.FAILURE)
    except AssertionError as err:
        raise AssertionError(f"{err}\nwebserver log:\n{server.log_tail()}") from None
    assert run.job_name == "guarded_backfill"
    assert example.public_hash() == before  # refused: the published view is unchanged

    # 2. the alert sensor's tick (no daemon here) on the webserver's instance: one alert per refusing gate
    alerts_file = tmp_path / "alerts.jsonl"
    resources = {
        "warehouse": warehouse_resource(str(server.spec)),
        "notifier": NotifierResource(kind="file", path=str(alerts_file)),
    }
    with (
        _env(DAGSTER_HOME=str(server.home), RECOVERY_UI_URL=base),
        dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(server.home))) as instance,
    ):
        checks = {
            ev.check_name: ev
            for e in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)
            if (ev := e.asset_check_evaluation) is not None
        }
        with dg.build_sensor_context(instance=instance, definitions=defs, resources=resources) as context:
            defs.resolve_sensor_def("asset_check_alert_sensor")(context)
    values = checks["values"]
    assert not values.passed and values.blocking
    description = present(values.description)
    sentence = description.split("; preview: ")[0]
    assert sentence.startswith("gate values refused: changed_share of amount_usd"), sentence
    alerts = [json.loads(line) for line in alerts_file.read_text().splitlines()]
    assert len(alerts) == sum(not c.passed for c in checks.values()), alerts
    (alert,) = [a for a in alerts if a["subject"].endswith(":values")]
    link = f"{base}/runs/{run_id}"
    assert description in alert["body"] and link in alert["body"], alert

    # 3. the alert's link opens the run page, which says which gate refused and why
    pg.goto(link)
    pg.get_by_text("Failure", exact=True).first.wait_for(timeout=60_000)
    pg.get_by_text("Loading run logs").wait_for(state="hidden", timeout=60_000)
    pg.get_by_text(sentence, exact=False).first.wait_for()
    text = pg.inner_text("body")
    assert "DagsterAssetCheckFailedError" not in text  # a decision, not an exception class
    assert "Traceback" not in text and 'File "' not in text and "Stack Trace" not in text, text[-3000:]
    screenshot(pg, "06-refused-run", shots)
