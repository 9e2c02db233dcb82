"""The browser tests' webserver and page helpers: ``dagster-webserver`` serving the code locations
against a temporary instance, and the Dagster UI's config editor driven from Playwright."""

from __future__ import annotations

import json
import os
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
import yaml

from recovery.config import LOCATION_NAME, PROJECT_ROOT
from recovery_tests.support.example_build import env as _env

CHROMIUM = Path("/usr/bin/chromium")


ARTIFACTS = PROJECT_ROOT / "test-artifacts" / "browser"


LOCATION = LOCATION_NAME


EXAMPLE_LOCATION = "worked_example"  # the worked example's own code location, beside the package's in workspace.yaml


# Runs launch immediately (no QueuedRunCoordinator, which Dagster 1.13 uses by default, so no daemon).
INSTANCE_YAML = {
    "storage": {"sqlite": {"base_dir": {"env": "DAGSTER_HOME"}}},  # the test process reads it with DAGSTER_HOME set too
    "run_coordinator": {
        "module": "dagster._core.run_coordinator.sync_in_memory_run_coordinator",
        "class": "SyncInMemoryRunCoordinator",
    },
    "telemetry": {"enabled": False},
}


@dataclass(frozen=True)
class Webserver:
    url: str
    home: Path
    spec: Path
    log: Path
    specs: Path | None = None  # RECOVERY_SPECS, when further datasets are served

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def graphql(url: str, query: str) -> dict:
    req = urllib.request.Request(
        f"{url}/graphql", data=json.dumps({"query": query}).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


LOCATIONS = (
    "{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus locationOrLoadError { "
    "__typename } } } } }"
)


def wait_for_location(server: Webserver, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"dagster-webserver exited with {proc.returncode}:\n{server.log_tail()}")
        try:
            entries = graphql(server.url, LOCATIONS)["data"]["workspaceOrError"]["locationEntries"]
            last = entries
            loaded = {e["name"]: e for e in entries if e["loadStatus"] == "LOADED"}
            if {LOCATION, EXAMPLE_LOCATION} <= set(loaded):
                for name in (LOCATION, EXAMPLE_LOCATION):
                    assert loaded[name]["locationOrLoadError"]["__typename"] == "RepositoryLocation", (
                        loaded[name],
                        server.log_tail(),
                    )
                return
        except (OSError, KeyError, TypeError, ValueError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"code location {LOCATION} not loaded after {timeout_s:.0f}s ({last}):\n{server.log_tail()}")


@contextmanager
def serve(home: Path, spec: Path, log: Path, specs: Path | None = None) -> Iterator[Webserver]:
    """dagster-webserver on a free localhost port, for the instance in ``home``, serving ``spec``
    (``RECOVERY_SPEC``, the way a deployed code location is pointed at a dataset) and, when given,
    the further datasets of ``specs`` (``RECOVERY_SPECS``: a directory or a list of specs)."""
    (home / "dagster.yaml").write_text(yaml.safe_dump(INSTANCE_YAML))
    port = free_port()
    server = Webserver(f"http://127.0.0.1:{port}", home, spec, log, specs)
    # RECOVERY_UI_URL: the launchpad links a phase's run logs lead back to this webserver
    environ = {**os.environ, "DAGSTER_HOME": str(home), "RECOVERY_SPEC": str(spec), "RECOVERY_UI_URL": server.url}
    environ.pop("RECOVERY_SPECS", None)
    if specs is not None:
        environ["RECOVERY_SPECS"] = str(specs)
    exe = Path(sys.executable).with_name("dagster-webserver")
    with open(server.log, "ab") as out:
        proc = subprocess.Popen(
            [str(exe), "-w", str(PROJECT_ROOT / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(port)],
            cwd=str(PROJECT_ROOT),
            env=environ,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for_location(server, proc)
        graphql(server.url, "mutation { setNuxSeen }")  # the community sign-up dialog would cover the page
        yield server
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def screenshot(pg, name: str, into: Path = ARTIFACTS) -> None:
    pg.screenshot(path=str(into / f"{name}.png"), full_page=True)


def wait_for_run(
    home: Path, run_id: str, timeout_s: float = 120, status: dg.DagsterRunStatus = dg.DagsterRunStatus.SUCCESS
) -> dg.DagsterRun:
    """The run once it finished, which must be with ``status``."""
    from dagster._core.instance.ref import InstanceRef

    deadline = time.monotonic() + timeout_s
    with _env(DAGSTER_HOME=str(home)), dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        while time.monotonic() < deadline:
            run = instance.get_run_by_id(run_id)
            if run is not None and run.is_finished:
                if run.status != status:
                    errors = [
                        e.message for e in instance.all_logs(run_id) if e.dagster_event and e.dagster_event.is_failure
                    ]
                    raise AssertionError(f"run {run_id} ended {run.status.value}: {errors}")
                return run
            time.sleep(0.5)
    raise AssertionError(f"run {run_id} did not finish in {timeout_s:.0f}s")


def editor_value(scope) -> str:
    return scope.locator(".CodeMirror").first.evaluate("el => el.CodeMirror.getValue()")


def clear_editor(pg, scope) -> None:
    editor = scope.locator(".CodeMirror").first
    editor.wait_for()
    editor.click()
    pg.keyboard.press("Control+A")
    pg.keyboard.press("Delete")
    assert editor_value(scope) == ""
