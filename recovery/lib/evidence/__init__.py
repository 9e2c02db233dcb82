"""Preserve an incident's evidence before anything is cleaned (runbook step 3).

- :mod:`.tables`: which warehouse relations a bundle copies, as SQL;
- :mod:`.keys`: the key of the keyed hashes that stand in for sensitive values;
- :mod:`.bundle`: building the immutable, owner-only folder;
- :mod:`.snapshots`: a bundle's source snapshots, read from its change log's copy;
- :mod:`.manifest`: the manifest and verifying a bundle against it.
"""

from recovery.lib.evidence.bundle import EvidenceResult, build_evidence, code_version, recorded_manifest_sha256
from recovery.lib.evidence.keys import KEY_ENV, load_evidence_key
from recovery.lib.evidence.manifest import MANIFEST, Problem, Verification, read_manifest, verify_bundle
from recovery.lib.evidence.snapshots import choose_snapshot, snapshot_entries, snapshot_rows_sql, write_snapshot

__all__ = [
    "EvidenceResult",
    "build_evidence",
    "code_version",
    "recorded_manifest_sha256",
    "KEY_ENV",
    "load_evidence_key",
    "MANIFEST",
    "Problem",
    "Verification",
    "read_manifest",
    "verify_bundle",
    "choose_snapshot",
    "snapshot_entries",
    "snapshot_rows_sql",
    "write_snapshot",
]
