"""The key that turns sensitive values into keyed hashes inside evidence.

Evidence copies people's and money data, so a column the spec declares sensitive
is stored as ``HMAC-SHA256(key, value)``: the same value hashes the same way
in every file of every bundle of this warehouse (so reconciliation can still join
source to target on it), while nobody holding only the bundle can recover the
value or test a guess. The key therefore never goes into a bundle: it comes from
``RECOVERY_EVIDENCE_KEY`` or from a key file created once beside the warehouse,
readable only by its owner, and the manifest names it only by a fingerprint.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from recovery.lib.errors import RecoveryError

KEY_ENV = "RECOVERY_EVIDENCE_KEY"


@dataclass(frozen=True)
class EvidenceKey:
    secret: str
    origin: str  # "env RECOVERY_EVIDENCE_KEY" or the key file's path

    @property
    def key_id(self) -> str:
        """A fingerprint naming the key in manifests without revealing it."""
        return hashlib.sha256(("recovery-evidence-key-id:" + self.secret).encode()).hexdigest()[:16]


def key_file_for(warehouse: Path) -> Path:
    """The per-warehouse key file: beside the warehouse, never under an evidence folder."""
    return warehouse.with_name(warehouse.name + ".evidence-key")


def load_evidence_key(warehouse: Path) -> EvidenceKey:
    """The environment's key if set, else the warehouse's key file (created on first use, mode 0600)."""
    env = os.environ.get(KEY_ENV)
    if env:
        if len(env) < 16:
            raise RecoveryError(
                f"{KEY_ENV} is too short to key hashes of sensitive columns; use at least 16 characters"
            )
        return EvidenceKey(env, f"env {KEY_ENV}")
    path = key_file_for(warehouse)
    if not path.exists():
        # write a private temp file, then link it into place: link() refuses to replace an
        # existing file, so concurrent first uses agree on one key and never read half of one
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise RecoveryError(f"evidence key file {path} is readable by other users (mode {mode:o}); run chmod 600 on it")
    secret = path.read_text().strip()
    if len(secret) < 16:
        raise RecoveryError(f"evidence key file {path} holds no usable key; delete it only if no bundle depends on it")
    return EvidenceKey(secret, str(path))
