"""The one reader of times people write: semesters, prices and node reports share it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from broker.errors import SpecError
from broker.money.handlers import parse_when as money_when
from broker.nodes.handlers import parse_when as report_when
from broker.timeparse import parse_when

NOW = datetime(2026, 9, 1, 12, 0, 0, 250_000, tzinfo=UTC)
PLUS2 = timezone(timedelta(hours=2))


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("now", NOW),
        ("+90s", NOW + timedelta(seconds=90)),
        ("+10m", NOW + timedelta(minutes=10)),
        ("+2h", NOW + timedelta(hours=2)),
        ("+3d", NOW + timedelta(days=3)),
        ("-7d", NOW - timedelta(days=7)),
        ("-12h", NOW - timedelta(hours=12)),
        ("+1h30m", NOW + timedelta(minutes=90)),
        ("+90", NOW + timedelta(minutes=90)),  # a bare number is minutes, as in Slurm
        ("-1-00:00:00", NOW - timedelta(days=1)),
        ("2026-09-01", datetime(2026, 9, 1, tzinfo=UTC)),
        ("2026-09-01T08:00:00Z", datetime(2026, 9, 1, 8, tzinfo=UTC)),
        ("2026-09-01T08:00", datetime(2026, 9, 1, 8, tzinfo=UTC)),
        ("2026-09-01T08:00:00+02:00", datetime(2026, 9, 1, 8, tzinfo=PLUS2)),
        (" 2026-09-01 ", datetime(2026, 9, 1, tzinfo=UTC)),
    ],
)
def test_forms(text: str, want: datetime) -> None:
    got = parse_when(text, NOW)
    assert got == want and got.utcoffset() == want.utcoffset()


def test_end_of_day_is_the_first_second_of_the_next() -> None:
    assert parse_when("2027-01-31", NOW, end_of_day=True) == datetime(2027, 2, 1, tzinfo=UTC)
    assert parse_when("2027-01-31T10:00Z", NOW, end_of_day=True) == datetime(2027, 1, 31, 10, tzinfo=UTC)


@pytest.mark.parametrize("bad", ["", "later", "+", "-", "+x", "+1y", "2026-13-01", "2026-09-01T25:00",
                                 "+99999999999d", "-99999999d", "9999-12-31"])
def test_garbage_and_out_of_range_are_value_errors(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_when(bad, NOW, end_of_day=True)


def test_money_fields_are_utc_whole_seconds() -> None:
    assert money_when("now", NOW, field="start") == NOW.replace(microsecond=0)
    assert money_when("+10m", NOW, field="start") == (NOW + timedelta(minutes=10)).replace(microsecond=0)
    got = money_when("2026-09-01T08:00:00.5+02:00", NOW, field="start")
    assert got == datetime(2026, 9, 1, 6, tzinfo=UTC) and got.tzinfo is UTC
    assert money_when("2027-01-31", NOW, field="end", end_of_day=True) == datetime(2027, 2, 1, tzinfo=UTC)
    for bad in (None, "", "  ", 5):
        with pytest.raises(SpecError, match="give a date or time"):
            money_when(bad, NOW, field="start")
    with pytest.raises(SpecError, match="start: 'soon' is not a date or time"):
        money_when("soon", NOW, field="start")


def test_report_bounds_keep_their_offset_and_precision() -> None:
    assert report_when(None, NOW) is None and report_when("", NOW) is None
    assert report_when("-7d", NOW) == NOW - timedelta(days=7)
    got = report_when("2026-09-01T08:00:00.5+02:00", NOW)
    assert got is not None and got.utcoffset() == timedelta(hours=2) and got.microsecond == 500_000
    with pytest.raises(SpecError, match="cannot read the time"):
        report_when("last week", NOW)


@pytest.mark.parametrize("bad", ["2026-12-31+02:00", "2026-12-31-05:00", "2026-12-31x0800", "20261231+0200"])
def test_a_date_and_a_time_are_joined_by_t_or_a_space(bad: str) -> None:
    """Python 3.11 takes any character after the date as the separator: 2026-12-31+02:00 would be 02:00."""
    with pytest.raises(ValueError, match="joined by 'T' or a space"):
        parse_when(bad, NOW)
    assert parse_when("2026-12-31 08:00+02:00", NOW) == datetime(2026, 12, 31, 6, tzinfo=UTC)
    assert parse_when("20261231T0800Z", NOW) == datetime(2026, 12, 31, 8, tzinfo=UTC)


def test_a_refusal_says_what_the_reader_found() -> None:
    with pytest.raises(SpecError, match=r"'\+1h30' is not a date or time \(the minutes need their unit: write 1h30m\)"):
        money_when("+1h30", NOW, field="start")
    with pytest.raises(SpecError, match=r"\(a date and a time are joined by 'T' or a space\)"):
        report_when("2026-12-31+02:00", NOW)
    with pytest.raises(SpecError) as info:
        money_when("2026-13-01T00:00", NOW, field="start")
    assert "Invalid isoformat" not in str(info.value)
