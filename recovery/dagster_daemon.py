"""``dagster-daemon run`` for the daemons the worked example (``make run``) and the tests start and stop.

Dagster's backfill daemon sleeps ``DEFAULT_DAEMON_INTERVAL_SECONDS`` (30 s) between iterations and
marks a backfill finished only on the iteration after its last run ends, so a daemon started to
execute one backfill sits idle for up to 30 s after the work is done, and a backfill whose assets
depend on each other waits that long between each layer. A daemon we start, wait on and stop
iterates every ``RECOVERY_DAEMON_INTERVAL_S`` seconds (3 by default) instead; it is otherwise
Dagster's own command. A team's long-running daemon (``make ui``, their deployment) keeps Dagster's
interval: it is not started through this module.
"""

from __future__ import annotations

import os
import sys

from dagster._daemon import controller

INTERVAL_VARIABLE = "RECOVERY_DAEMON_INTERVAL_S"
DEFAULT_INTERVAL_S = 3.0


def interval_s() -> float:
    raw = os.environ.get(INTERVAL_VARIABLE, "")
    try:
        value = float(raw) if raw else DEFAULT_INTERVAL_S
    except ValueError:
        raise SystemExit(f"{INTERVAL_VARIABLE}={raw!r} is not a number of seconds; unset it or give e.g. 3") from None
    if value <= 0:
        raise SystemExit(f"{INTERVAL_VARIABLE}={raw!r} must be more than 0 seconds; unset it or give e.g. 3")
    return value


def main() -> None:
    # read at each iteration by the backfill loop and once, at start, by the asset daemon
    controller.DEFAULT_DAEMON_INTERVAL_SECONDS = interval_s()  # type: ignore[assignment]
    from dagster._daemon.cli import main as dagster_daemon_main

    sys.argv = ["dagster-daemon", *sys.argv[1:]]
    dagster_daemon_main()


if __name__ == "__main__":
    main()
