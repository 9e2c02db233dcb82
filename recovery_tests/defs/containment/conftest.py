"""The containment tests' fixture: a private copy of the failed example, a fresh Dagster instance."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from recovery.config import PROJECT_ROOT
from recovery_tests.support.containment import Env


@pytest.fixture
def env(example_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(PROJECT_ROOT / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("RECOVERY_SPEC", str(example_copy))
    monkeypatch.delenv("RECOVERY_ALERT_WEBHOOK", raising=False)
    return Env(example_copy, example_copy.parent / "incident.yaml", home)
