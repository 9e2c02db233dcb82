"""An evidence root is a directory of the launching user, never a system one; a user's directory on the
shared RAM disk ``/dev/shm`` is like one under ``/tmp``."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from recovery.lib.errors import SpecError
from recovery.lib.incident.evidence_root import check_evidence_root


@pytest.mark.parametrize("root", ["/", "/tmp", "/dev/shm", "/dev", "/dev/mqueue/x", "/proc/self", "/usr/share/ev"])
def test_shared_and_system_directories_are_refused_naming_the_field(root: str):
    with pytest.raises(SpecError, match="evidence_root"):
        check_evidence_root(Path(root))


@pytest.mark.skipif(not os.access("/dev/shm", os.W_OK), reason="no writable /dev/shm here")
def test_a_directory_of_ones_own_below_dev_shm_is_accepted_like_one_below_tmp():
    mine = Path("/dev/shm") / f"recovery-evidence-{uuid.uuid4().hex[:8]}"
    check_evidence_root(mine / "evidence")  # not created yet, below a directory the user may write to
    check_evidence_root(Path("/tmp") / mine.name / "evidence")
    assert not mine.exists()
