"""``make test`` hands the longest test modules out first (``LONGEST_FIRST`` in
``recovery_tests/conftest.py``, with ``--no-loadscope-reorder``): a name there that no longer
names exactly one module (renamed, moved, duplicated) would quietly send that module back to the
end of the queue, where a module of minutes runs alone while the other worker idles."""

from __future__ import annotations

from collections import Counter

from recovery.config import PROJECT_ROOT
from recovery_tests.conftest import LONGEST_FIRST


def test_every_longest_first_name_is_exactly_one_test_module():
    modules = Counter(p.name for p in (PROJECT_ROOT / "recovery_tests").rglob("test_*.py"))
    assert {name: modules[name] for name in LONGEST_FIRST if modules[name] != 1} == {}
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)


def test_make_test_keeps_the_collection_order():
    recipe = (PROJECT_ROOT / "Makefile").read_text()
    assert "--dist loadscope --no-loadscope-reorder" in recipe
