"""Errors that a person can act on.

Every error raised at an entry point names the field (or object) at fault and the
fix, because the people reading it are on call for an incident and need the next
step, not a traceback.
"""

from __future__ import annotations

_LINE_BREAKS = frozenset("\u2028\u2029")


def one_line(text: str) -> str:
    """``text`` with every control character (a newline, a carriage return, an escape) and line
    separator written as its escape (``\\n``): a path or value a user gave is quoted, never allowed
    to break the one line an error is printed on."""
    if text.isprintable():
        return text
    return "".join(
        ch.encode("unicode_escape").decode("ascii")
        if (ord(ch) < 32 or 0x7F <= ord(ch) < 0xA0 or ch in _LINE_BREAKS)
        else ch
        for ch in text
    )


class RecoveryError(Exception):
    """Base class: an expected failure with a message meant for a human.

    ``exit_code`` is what the ``recovery`` command exits with (README, "exit codes"):
    2 for bad input or a verb run out of order (nothing written), 1 when a gate or a
    check said no. Its text is always one line (``one_line``), whatever the values it quotes."""

    exit_code = 2

    def __str__(self) -> str:
        return one_line(super().__str__())


class OutOfOrderError(RecoveryError):
    """A verb needs an earlier one that has not run for this incident; nothing was written."""


class GateRefusedError(RecoveryError):
    """A gate or check said no: the run stopped and the published view is unchanged."""

    exit_code = 1


class SpecError(RecoveryError):
    """A dataset spec or incident file is invalid; nothing was written."""

    def __init__(self, field: str, problem: str, fix: str, *, source: str | None = None):
        self.field = field
        self.problem = problem
        self.fix = fix
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{field}: {problem}. Fix: {fix}")


class FencedGenerationError(RecoveryError):
    """A write (or read for propagation) names a generation that is fenced."""

    def __init__(self, generation: str, detail: str = ""):
        self.generation = generation
        msg = f"generation {generation!r} is fenced: its writes are refused"
        super().__init__(msg + (f" ({detail})" if detail else ""))


class WarehouseBusyError(RecoveryError):
    """The warehouse file stayed locked by another process past the retry budget."""


class SchemaMismatchError(RecoveryError):
    """Rows offered to the writer do not have the target's columns."""


class RunCrashedError(RecoveryError):
    """A Dagster run failed on something unexpected; ``detail`` holds the trace for the log file."""

    exit_code = 3

    def __init__(self, message: str, *, detail: str = ""):
        super().__init__(message)
        self.detail = detail


# failures of the machine rather than of the recovery: what the person on call can do about each
_ENVIRONMENT = (
    (
        "no space left on device",
        "the disk is full: free space on the file system of the file named (DuckDB spills beside the "
        "warehouse file, in <warehouse>.tmp, past memory_limit) and run the command again",
    ),
    (
        "out of memory",
        "the engine ran out of memory: raise warehouse.memory_limit in the spec (DuckDB spills past it) "
        "or lower warehouse.threads, and run the command again",
    ),
)


def environment_hint(message: str) -> str | None:
    """What to do about a failure that comes from the machine (a full disk, too little memory),
    not from the recovery; None when the message is not one of those."""
    low = message.lower()
    return next((hint for needle, hint in _ENVIRONMENT if needle in low), None)


class DuplicateKeyError(RecoveryError):
    """A write offered two rows for one key; the whole write was rolled back."""
