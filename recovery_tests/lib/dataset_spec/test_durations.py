"""Durations as a spec gives them and as a sentence reads them back (``recovery/lib/dataset_spec/durations.py``)."""

from datetime import timedelta

import pytest

from recovery.lib.dataset_spec.durations import format_duration, parse_duration


@pytest.mark.parametrize(
    ("given", "seconds"),
    [
        ("6h", 21_600),
        ("90m", 5_400),
        ("1d 12h", 129_600),
        ("1.5h", 5_400),
        ("2W", 1_209_600),
        ("PT6H", 21_600),
        ("P1DT2H30M", 95_400),
        (3600, 3_600),
        ("45", 45),
        (timedelta(minutes=5), 300),
    ],
)
def test_the_forms_a_person_writes_parse(given, seconds):
    assert parse_duration(given) == timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ("soon", "is not a duration"),
        ("6 parsecs", "is not a duration"),
        ("PT", "is not a duration"),
        ("-1h", "is not a positive duration"),
        (0, "is not a positive duration"),
        (True, "is not a duration"),
        (float("nan"), "is not a duration"),
        ("1e400", "is not a duration"),
        ("99999d", "is longer than ten years"),
        (None, "is not a duration"),
    ],
)
def test_anything_else_is_refused_saying_what_is_wrong(given, problem):
    with pytest.raises(ValueError, match=problem):
        parse_duration(given)


def test_an_age_reads_as_its_largest_units():
    assert [
        format_duration(timedelta(seconds=s))
        for s in (0, 45, 601, 3 * 3600 + 5, 3 * 3600 + 12 * 60, 2 * 86_400 + 4 * 3600 + 7)
    ] == ["0s", "45s", "10m", "3h", "3h 12m", "2d 4h"]
    assert format_duration(timedelta(seconds=-5)) == "0s"  # a clock ahead of the check is no negative age
