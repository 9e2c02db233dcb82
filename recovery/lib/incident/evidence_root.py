"""Where an incident may put its evidence: a directory of the launching user, never a system one.

An evidence bundle copies warehouse rows and is made owner-only, so its root is checked
before anything is written: ``evidence_root: /``, ``/proc/self`` or ``../../../../etc`` in an
incident file must be a one-line refusal, not a bundle in (or an error deep inside) a
system directory.
"""

from __future__ import annotations

import os
from pathlib import Path

from recovery.lib.errors import SpecError

SYSTEM_DIRS = tuple(
    Path(p)
    for p in (
        "/proc",
        "/sys",
        "/dev",
        "/etc",
        "/boot",
        "/bin",
        "/sbin",
        "/lib",
        "/lib32",
        "/lib64",
        "/libx32",
        "/usr",
        "/run",
        "/var/run",
        "/var/lib",
        "/var/log",
        "/var/spool",
        "/var/cache",
        "/snap",
    )
)
"""Trees no evidence may go into (virtual file systems, the OS, package state, logs)."""

SHARED_SCRATCH = (Path("/dev/shm"),)
"""Shared RAM-backed scratch inside a system tree: like ``/tmp``, a user's directory below it is fine,
the shared directory itself is not (test suites and CI put their files there)."""

_FIX = (
    "set evidence_root to a directory you own outside system directories (or omit it: evidence/ beside the warehouse)"
)


def check_evidence_root(root: Path | None, *, field: str = "evidence_root", source: str | None = None) -> None:
    """Raise ``SpecError`` unless ``root`` (already resolved) is a safe evidence root.

    Safe: not ``/`` nor a top-level directory (``/tmp``, ``/home`` are shared) nor ``/dev/shm``, not
    in a system tree (a directory below ``/dev/shm`` is not), and either an existing directory owned
    by the effective user, or not yet existing below a directory the user may write to (it is
    created owner-only)."""
    if root is None:
        return
    root = Path(os.path.abspath(root))
    if root == Path(root.anchor) or len(root.parts) == 2 or root in SHARED_SCRATCH:
        raise SpecError(field, f"{root} is the root or a top-level directory, shared by everyone", _FIX, source=source)
    scratch = any(d in root.parents for d in SHARED_SCRATCH)
    for system in SYSTEM_DIRS:
        if not scratch and (root == system or system in root.parents):
            raise SpecError(field, f"{root} is inside the system directory {system}", _FIX, source=source)
    try:
        if root.exists() or root.is_symlink():
            if not root.is_dir():
                raise SpecError(field, f"{root} exists and is not a directory", _FIX, source=source)
            owner = root.stat().st_uid
            if owner != os.geteuid():
                raise SpecError(
                    field,
                    f"{root} is owned by uid {owner}, not by the user running the recovery (uid {os.geteuid()})",
                    _FIX,
                    source=source,
                )
            return
        parent = root.parent
        while not parent.exists():
            parent = parent.parent
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise SpecError(
                field, f"{root} does not exist and {parent} is not a directory you may write to", _FIX, source=source
            )
    except OSError as e:
        raise SpecError(field, f"cannot inspect {root} ({e.strerror or e})", _FIX, source=source) from None
