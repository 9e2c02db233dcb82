"""The bundle's manifest and its verification.

``manifest.json`` lists every file of a bundle with its sha256, size and (for
tables and logs) row count; it is written last, so a bundle with a manifest is a
complete bundle. Verification recomputes every checksum and reports, by path,
each file that changed, went missing, appeared unlisted, or became readable by
other users. The manifest's own sha256 is recorded in the control plane's
timeline when the bundle is built, so editing a file *and* its manifest entry is
caught too (when the warehouse is at hand).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "manifest.json"
FORMAT = "recovery-evidence/2"  # 2: source snapshots as key lists over the change log's copy
FILE_MODE = 0o600
DIR_MODE = 0o700


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def restrict(root: Path) -> None:
    """Owner-only permissions on a bundle: files 0600, directories 0700."""
    os.chmod(root, DIR_MODE)
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            os.chmod(Path(dirpath) / d, DIR_MODE)
        for f in filenames:
            os.chmod(Path(dirpath) / f, FILE_MODE)


def bundle_files(root: Path) -> list[str]:
    """Every file under ``root`` except the manifest, as sorted POSIX paths relative to it."""
    out = []
    for dirpath, _, filenames in os.walk(root):
        for f in filenames:
            rel = (Path(dirpath) / f).relative_to(root).as_posix()
            if rel != MANIFEST:
                out.append(rel)
    return sorted(out)


def write_manifest(root: Path, manifest: dict) -> str:
    """Write ``manifest.json`` (owner-only) and return its sha256."""
    path = root / MANIFEST
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    with os.fdopen(fd, "w") as f:
        json.dump(manifest, f, indent=2, sort_keys=False, default=str)
        f.write("\n")
    return sha256_file(path)


def read_manifest(root: Path) -> dict:
    return json.loads((root / MANIFEST).read_text())


@dataclass(frozen=True)
class Problem:
    path: str
    issue: str

    def __str__(self) -> str:
        return f"{self.path}: {self.issue}"


@dataclass(frozen=True)
class Verification:
    bundle: Path
    files_checked: int
    problems: tuple[Problem, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_bundle(root: Path, *, recorded_manifest_sha256: str | None = None) -> Verification:
    """Recompute every checksum of a bundle against its manifest; name each file that differs."""
    root = Path(root)
    if not (root / MANIFEST).is_file():
        return Verification(root, 0, (Problem(MANIFEST, "missing: this folder is not a complete evidence bundle"),))
    problems: list[Problem] = []
    if recorded_manifest_sha256 and sha256_file(root / MANIFEST) != recorded_manifest_sha256:
        problems.append(
            Problem(
                MANIFEST,
                "changed since the bundle was built (its sha256 differs from the one "
                "recorded in the control plane's timeline)",
            )
        )
    try:
        listed = {f["path"]: f for f in read_manifest(root)["files"]}
    except (ValueError, KeyError, TypeError) as err:
        return Verification(root, 0, (*problems, Problem(MANIFEST, f"unreadable ({err})")))
    present = set(bundle_files(root))
    for rel in sorted(listed):
        path = root / rel
        if rel not in present:
            problems.append(Problem(rel, "missing"))
            continue
        actual = sha256_file(path)
        if actual != listed[rel]["sha256"]:
            problems.append(
                Problem(rel, f"changed: sha256 {actual[:12]}… but the manifest says {listed[rel]['sha256'][:12]}…")
            )
        elif path.stat().st_size != listed[rel]["bytes"]:
            problems.append(Problem(rel, "changed: size differs from the manifest"))
    for rel in sorted(present - set(listed)):
        problems.append(Problem(rel, "extra: not listed in the manifest"))
    for rel in [MANIFEST, *sorted(present)]:
        mode = (root / rel).stat().st_mode & 0o777
        if mode & 0o077:
            problems.append(Problem(rel, f"readable by other users (mode {mode:o}); evidence is owner-only"))
    return Verification(root, len(listed), tuple(problems))
