"""The browser tests' fixtures: a webserver serving a private copy of the failed example, and a page."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from recovery_tests.support.browser import ARTIFACTS, CHROMIUM, serve


@pytest.fixture
def webserver(failed_example, example_copy: Path, tmp_path: Path):
    """The webserver serving a private copy of the failed example, with a copy of its instance."""
    home = tmp_path / "dagster_home"
    shutil.copytree(failed_example.dagster_home, home, ignore=shutil.ignore_patterns("*.log", "dagster.yaml"))
    with serve(home, example_copy, tmp_path / "webserver.log") as server:
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
