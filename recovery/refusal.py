"""A refusal raised from a step: a decision on the run page, not a stack trace.

A step refuses (a phase launched too early, an incident that does not validate, a gate that
says no) by failing with ``dg.Failure`` whose description is the one sentence and whose
metadata carries the facts. Dagster records the failure with the Python stack of the raise,
and the UI prints it under the sentence ("Stack Trace: File ..."): a decision read as a crash.
Dagster serializes the failure (``traceback.TracebackException``) right after it catches it,
and that reads ``sys.tracebacklimit``: ``refuse`` sets it to 0 just before raising, so the
recorded failure has the sentence and the metadata and no frames. The limit is put back by the
next step of ours that starts (``incident_for_step`` calls ``restore_tracebacks``) and after an
in-process run (``recovery.orchestration.run_job``); the steps a refusal leaves to run are the
ones downstream of it, which Dagster skips.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, NoReturn

import dagster as dg

_SAVED: list[int | None] = []  # the limit before a refusal set it (at most one entry)


def refuse(description: str, metadata: Mapping[str, Any] | None = None) -> NoReturn:
    """Fail the step with ``description`` (one sentence) and ``metadata``; no stack trace is recorded."""
    if not _SAVED:
        _SAVED.append(getattr(sys, "tracebacklimit", None))
    sys.tracebacklimit = 0
    raise dg.Failure(description=description, metadata=dict(metadata or {}), allow_retries=False)


def restore_tracebacks() -> None:
    """Put back the traceback limit a refusal changed (no-op when none did)."""
    if not _SAVED:
        return
    saved = _SAVED.pop()
    if saved is None:
        if hasattr(sys, "tracebacklimit"):
            del sys.tracebacklimit
    else:
        sys.tracebacklimit = saved
