"""Python's cyclic garbage collector during a command's start-up.

Before its first statement against the data, a command imports Dagster and the package
and builds the code location's definitions: a couple of hundred thousand objects that
live as long as the process, and little garbage. The collector's full passes traverse
every one of them, several times over while they are being made. Here those blocks
(``settling``) run with the collector paused, and within a command (``command_scope``, the
CLI's ``main``) what is alive at the end of each is frozen (``gc.freeze``): left out of
later passes, which then look at the command's own work only. Garbage is still collected
everywhere else; the frozen objects go back to the collector when the command ends (a
process that calls ``main`` more than once, a test, keeps collecting them).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_in_command: list[bool] = [False]


@contextmanager
def command_scope() -> Iterator[None]:
    """One command: the blocks that settle inside it freeze what they leave alive, until it ends."""
    outer = _in_command[0]
    _in_command[0] = True
    try:
        yield
    finally:
        _in_command[0] = outer
        if not outer:
            gc.unfreeze()


@contextmanager
def settling() -> Iterator[None]:
    """A block that makes many long-lived objects and little garbage (imports, the definitions):
    the collector pauses within it; inside a command, what is alive at its end is frozen."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if _in_command[0]:
            gc.freeze()
        if enabled:
            gc.enable()
