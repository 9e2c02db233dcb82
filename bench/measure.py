"""Run one measured step in a fresh process: wall time and that process's peak memory."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path


def in_subprocess(module: str, *args: str) -> dict:
    """Run ``python -m module args``; it prints one JSON line; add its wall time and peak RSS."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"{module} {' '.join(args)} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["wall_s_outer"] = wall
    return result


def report(result: dict) -> None:
    """Called by the worker: print its result with its own peak RSS (MB)."""
    from recovery.lib.trace import peak_rss_mb  # VmHWM: ru_maxrss survives exec

    result["peak_rss_mb"] = peak_rss_mb()
    print(json.dumps(result, default=str))


def recovery_cli(*args: str, env: dict, cwd=None) -> subprocess.CompletedProcess:
    """Run the ``recovery`` command (this interpreter's) as a user would; a failure raises with its output's tail."""
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("recovery")), *args], env=env, capture_output=True, text=True, cwd=cwd
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"recovery {args[0]} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


def use_spark(spec_path, conf: dict[str, str] | None = None) -> None:
    """Rewrite a spec's warehouse to the Spark engine on ``local[2]``, data beside the spec, the
    same control file (``recovery spark-import`` then moves the data plane)."""
    import yaml

    doc = yaml.safe_load(Path(spec_path).read_text())
    doc["warehouse"] = {
        "engine": "spark",
        "path": doc["warehouse"]["path"],
        "spark": {"data_path": "spark_data", "master": "local[2]", "conf": conf or {}},
    }
    Path(spec_path).write_text(yaml.safe_dump(doc, sort_keys=False))
