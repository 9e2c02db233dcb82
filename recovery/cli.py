"""The ``recovery`` command: validates its input, then launches the Dagster jobs the UI launches.

Each verb lives in ``recovery/commands/<verb>.py`` with a ``register(subparsers)``
function; this module only assembles them and turns every failure into one line
and the exit status the README documents: 0 done, 1 a gate or check said no,
2 bad input or a verb out of order (nothing written), 3 something unexpected (the
trace is in the log file the line names).
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import logging
import os
import pkgutil
import sys
import tempfile
import threading
import traceback
import warnings
from datetime import datetime
from pathlib import Path
from typing import NoReturn

from rich.console import Console

import recovery.commands
from recovery.config import PROJECT_ROOT
from recovery.lib.errors import RecoveryError, RunCrashedError, environment_hint
from recovery.startup import command_scope, settling

EXIT_UNEXPECTED = 3


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="recovery",
        description="Recover from a failed data backfill with Dagster.",
        epilog="exit status: 0 done, 1 a gate or check said no, 2 bad input or a verb run out of "
        "order (nothing written), 3 unexpected error (see the log file named)",
    )
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    for mod in sorted(pkgutil.iter_modules(recovery.commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"recovery.commands.{mod.name}")
        if hasattr(module, "register"):  # a verb; other modules are the verbs' helpers
            module.register(sub)
    return p


def log_dir() -> Path:
    """Where unexpected errors' traces go: ``$RECOVERY_LOG_DIR``, else the Dagster instance's ``logs/``."""
    explicit = os.environ.get("RECOVERY_LOG_DIR")
    home = os.environ.get("DAGSTER_HOME") or str(PROJECT_ROOT / ".dagster_home")
    for candidate in ([Path(explicit)] if explicit else []) + [
        Path(home) / "logs",
        Path(tempfile.gettempdir()) / "recovery-logs",
    ]:
        try:
            candidate.mkdir(parents=True, exist_ok=True)
            return candidate
        except OSError:
            continue
    return Path(tempfile.gettempdir())


def write_trace(argv: list[str], text: str) -> Path:
    path = log_dir() / f"recovery-{datetime.now().strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    path.write_text(f"recovery {' '.join(argv)}\n\n{text}\n")
    return path


def main(argv: list[str] | None = None, console: Console | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    warnings.filterwarnings("ignore", message=r"(?i).*(beta|preview|supersession)")
    logging.getLogger("dagster").setLevel(logging.CRITICAL)  # run logs live in the instance; the terminal gets one line
    if console is None:
        console = Console()
        if not console.is_terminal:  # piped or in CI: wide enough for the tables to stay readable
            console = Console(width=150)
    with command_scope():
        return _run(argv, console)


def _run(argv: list[str], console: Console) -> int:
    with settling():  # every verb's module, Dagster's among them: long-lived objects, no garbage
        parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.fn(args, console) or 0)
    except RunCrashedError as err:
        log = write_trace(argv, err.detail or str(err))
        console.print(f"[red]error:[/] {err} (trace: {log})", highlight=False, soft_wrap=True)
        return err.exit_code
    except RecoveryError as err:
        console.print(f"[red]error:[/] {err}", highlight=False, soft_wrap=True)
        return err.exit_code
    except KeyboardInterrupt:
        console.print("interrupted", highlight=False)
        return 130
    except Exception as err:  # noqa: BLE001 - the one place an unexpected error becomes a line and a log file
        log = write_trace(argv, traceback.format_exc())
        said = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        hint = environment_hint(said)
        console.print(
            f"[red]error:[/] {f'{said}; {hint}' if hint else f'unexpected {said}'} "
            f"(trace: {log}{'' if hint else '; please report it'})",
            highlight=False,
            soft_wrap=True,
        )
        return EXIT_UNEXPECTED


def entry() -> NoReturn:
    """The ``recovery`` console script: ``main``, then the process ends without Python's teardown.

    A command leaves a few hundred thousand long-lived objects (Dagster, the definitions, the
    package); the interpreter's finalization would only free them, one by one, while the user waits
    for the prompt. What a normal exit does that matters is done first: the output flushed, Dagster's
    SQLite files closed (their write-ahead logs checkpointed), the ``atexit`` handlers run (logging's
    among them). A non-daemon thread still running takes the normal exit, which waits for it. ``main``
    itself returns, so a test or a script calling it keeps its process."""
    code = main()
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)  # work still running in a thread of ours: the normal exit waits for it
    sys.stdout.flush()
    sys.stderr.flush()
    sqlite = sys.modules.get("recovery.dagster_sqlite")
    if sqlite is not None:
        sqlite.ENGINES.dispose_all()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
