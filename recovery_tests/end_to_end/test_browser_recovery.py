"""The worked example's incident recovered from the Dagster UI alone (issue 35), in headless Chromium.

The incident is chosen once: the test opens the launchpad link the package gives for it (the draft
incident's alert carries the same link: ``contain_backfill``'s launchpad with the run tag
``recovery/incident``). Every later phase is launched from the launchpad link the previous phase's
run logged on its run page (the incident, and the partition range the launch needs: the whole target
for assess, the canary's range once the plan exists, each next wave's once a wave is built), in the
runbook's order: contain, evidence, assess, plan (the wave size typed there, not the incident),
canary, the waves, publish, restate, verify, timeline and reports. Publish launched right after the
canary is refused in its run: the run page shows the runbook's sentence and no stack trace. The
published table equals, row for row, what ``recovery recover`` publishes on another copy of the same
failed example (run meanwhile, in its own process and instance). A gate's refusal on its run page,
without a stack trace, is ``test_browser``'s guarded backfill.

Its own module, so that ``--dist loadscope`` runs it beside ``test_browser``'s tests, not after them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import duckdb
import pytest
import yaml

from recovery.config import PROJECT_ROOT
from recovery.lib.incident.phases import (
    ASSESS,
    CANARY,
    CONTAIN,
    EVIDENCE,
    INCIDENT_TAG,
    PLAN,
    PUBLISH,
    REPORT,
    RESTATE,
    TIMELINE,
    VERIFY,
    WAVE,
)
from recovery_tests.support.browser import (
    CHROMIUM,
    LOCATION,
    Webserver,
    clear_editor,
    editor_value,
    screenshot,
    wait_for_run,
)
from recovery_tests.support.rows import present

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason=f"{CHROMIUM} is absent: install Debian's chromium package "
        "(apt-get install -y chromium; .ci/run does) to run the browser test",
    ),
]

WAVE_SIZE = 1000  # typed once in plan_repair's launchpad (and given to `recovery recover`): a canary and one wave
NEXT_LINK = re.compile(r"(\S+?): (http://\S+/playground/setup\?\S+?)(?=;|$|\s)")


def test_the_worked_example_is_recovered_from_the_ui_alone(webserver: Webserver, page, failed_example, tmp_path: Path):
    cli = _recover_with_the_cli(failed_example, tmp_path / "cli")  # meanwhile, on its own copy and instance
    try:
        _recover_from_the_ui(webserver, page, tmp_path)
    except BaseException:
        screenshot(page, "zz-recover-failure", tmp_path)
        cli.kill()
        raise
    assert cli.wait(timeout=600) == 0, (tmp_path / "cli.log").read_text()[-3000:]
    ui_rows = _published_rows(webserver.spec)
    cli_rows = _published_rows(tmp_path / "cli" / "transactions" / "spec.yaml")
    assert len(ui_rows) > 1000
    assert ui_rows == cli_rows, _difference(ui_rows, cli_rows)


def _recover_with_the_cli(failed_example, root: Path) -> subprocess.Popen:
    from recovery_tests.support.example_build import copy_dataset

    spec = copy_dataset(failed_example.root, root / "transactions")
    home = root / "dagster_home"
    shutil.copytree(failed_example.dagster_home, home, ignore=shutil.ignore_patterns("*.log"))
    environ = {**os.environ, "DAGSTER_HOME": str(home), "RECOVERY_SPEC": str(spec)}
    exe = Path(sys.executable).with_name("recovery")
    incident = spec.with_name("incident.yaml")
    with open(root.parent / "cli.log", "wb") as out:
        return subprocess.Popen(
            [str(exe), "recover", "--incident", str(incident), "--wave-size", str(WAVE_SIZE)],
            cwd=str(PROJECT_ROOT),
            env=environ,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _published_rows(spec_path: Path) -> list[tuple]:
    """The published table's rows, sorted, without the columns a run stamps (generation, written at)."""
    from recovery.lib.dataset_spec.models import parse_spec

    spec = parse_spec(spec_path)
    meta = spec.target.metadata
    con = duckdb.connect(str(spec_path.with_name("warehouse.duckdb")), read_only=True)
    try:
        table = spec.target.table_name.sql()
        columns = [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]
        kept = ", ".join(f'"{c}"' for c in columns if c not in (meta.generation, meta.written_at))
        return con.execute(f"SELECT {kept} FROM {table} ORDER BY ALL").fetchall()
    finally:
        con.close()


def _difference(a: list[tuple], b: list[tuple]) -> str:
    from collections import Counter

    ca, cb = Counter(a), Counter(b)
    only_ui, only_cli = list((ca - cb).elements())[:5], list((cb - ca).elements())[:5]
    return f"{len(a)} vs {len(b)} rows; only from the UI: {only_ui}; only from the CLI: {only_cli}"


def _launch(pg, link: str, job: str, config: dict | None = None) -> str:
    """Open a launchpad link, type ``config`` when given, launch; returns the run's id (its page is open)."""
    pg.goto(link)
    pg.wait_for_url(re.compile(rf"/jobs/{job}/playground"))
    launch = pg.get_by_role("button", name="Launch Run")
    launch.wait_for()
    if config is not None:
        clear_editor(pg, pg)
        pg.keyboard.type(json.dumps(config))  # JSON is YAML in flow style
        assert yaml.safe_load(editor_value(pg)) == config
        pg.get_by_text("No errors").wait_for()
    launch.click()
    pg.wait_for_url(re.compile(r"/runs/[0-9a-f-]{36}"), timeout=60_000)
    return present(re.search(r"/runs/([0-9a-f-]{36})", pg.url)).group(1)


def _next_links(pg) -> dict[str, str]:
    """The launchpad links the open run page's run logged for the next phases, by job."""
    pg.get_by_text("Loading run logs").wait_for(state="hidden", timeout=60_000)
    pg.get_by_placeholder(re.compile("Filter", re.I)).first.fill("next:")
    line = pg.get_by_text(re.compile(r"chosen for this run .*; next: ")).first
    line.wait_for(timeout=60_000)
    return dict(NEXT_LINK.findall(line.inner_text()))


def _recover_from_the_ui(webserver: Webserver, pg, shots: Path) -> None:
    from recovery.lib.incident.draft import launchpad_url

    incident_file = webserver.spec.with_name("incident.yaml")
    done: list[str] = []

    def launched(link: str, job: str, config: dict | None = None, *, last: bool = False) -> dict[str, str]:
        """Launch from ``link``; once the run succeeded, the links it logged for the next phases."""
        run_id = _launch(pg, link, job, config)
        try:
            run = wait_for_run(webserver.home, run_id)
        except AssertionError as err:
            screenshot(pg, f"recover-{job}-failed", shots)
            raise AssertionError(f"{err}\nwebserver log:\n{webserver.log_tail()}") from None
        assert run.job_name == job and run.tags[INCIDENT_TAG] == str(incident_file), run.tags
        done.append(job)
        return {} if last else _next_links(pg)

    # the incident chosen once: the launchpad link the package gives for it (the draft incident's alert's)
    links = launched(launchpad_url(webserver.url, LOCATION, incident_file, CONTAIN.job), CONTAIN.job)
    for phase in (EVIDENCE, ASSESS):
        links = launched(links[phase.job], phase.job)
    plan_config = {"ops": {PLAN.nodes[0]: {"config": {"wave_size": WAVE_SIZE}}}}  # the wave size, not the incident
    links = launched(links[PLAN.job], PLAN.job, plan_config)
    links = launched(links[CANARY.job], CANARY.job)

    # out of order: publish before the waves is refused inside its run, with the runbook's sentence
    refused = _launch(pg, links[PUBLISH.job], PUBLISH.job)
    wait_for_run(webserver.home, refused, status=dg.DagsterRunStatus.FAILURE)
    sentence = PUBLISH.refusal(("built",), str(incident_file)).sentence
    _reads_without_a_stack_trace(pg, sentence, shots / "publish-before-the-waves.png")

    while WAVE.job in links:
        links = launched(links[WAVE.job], WAVE.job)
    links = launched(links[PUBLISH.job], PUBLISH.job)
    for phase in (RESTATE, VERIFY, TIMELINE):
        links = launched(links[phase.job], phase.job)
    launched(links[REPORT.job], REPORT.job, last=True)
    waves = done.count(WAVE.job)
    assert waves == 1, done  # each launch costs a run process; the waves are one loop (more in test_repair)
    assert done == [
        CONTAIN.job,
        EVIDENCE.job,
        ASSESS.job,
        PLAN.job,
        CANARY.job,
        *[WAVE.job] * waves,
        PUBLISH.job,
        RESTATE.job,
        VERIFY.job,
        TIMELINE.job,
        REPORT.job,
    ]


def _reads_without_a_stack_trace(pg, sentence: str, shot: Path) -> None:
    """The open run page of a refused run says the sentence, and shows no Python stack trace."""
    pg.get_by_text("Failure", exact=True).first.wait_for(timeout=60_000)
    pg.get_by_text("Loading run logs").wait_for(state="hidden", timeout=60_000)
    pg.get_by_text(sentence, exact=False).first.wait_for()
    text = pg.inner_text("body")
    assert "Traceback" not in text and 'File "' not in text and "Stack Trace" not in text, text[-3000:]
    pg.screenshot(path=str(shot), full_page=True)
