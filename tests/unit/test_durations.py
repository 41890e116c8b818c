"""The one duration reader: Slurm's grammar plus unit forms, for people and for Slurm's output."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.durations import format_duration, parse_duration
from broker.slurm.parse import parse_duration_s


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 5400), ("0", 0), ("5:00", 300), ("30:00", 1800), ("90:00", 5400), ("1:00:00", 3600),
        ("02:00:00", 7200), ("1-00:00:00", 86400), ("1-02", 93600), ("2-03", 183600), ("1-02:03", 93780),
        ("1-02:03:04", 93784), ("90s", 90), ("45m", 2700), ("2h", 7200), ("2h30m", 9000), ("1h30m", 5400),
        ("2d", 172800), ("1d1h1m1s", 90061), (" 2H ", 7200), ("0s", 0),
    ],
)  # fmt: skip
def test_slurm_and_unit_forms(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds
    assert parse_duration(text, strict=False) == seconds


@pytest.mark.parametrize("bad", ["", "  ", "h", "1x", "1h2d", "-5", "+5", "1--2", "1:2:3:4", "1-", ":30", "1.5h",
                                 "1 h", "1-2-3", "\u0669\u0660", "\u00b2", "\u0661h", "1:\u0663\u0660"])
def test_garbage_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)
    with pytest.raises(ValueError):
        parse_duration(bad, strict=False)


@pytest.mark.parametrize(("text", "seconds"), [("1:75:00", 8100), ("0:00:99", 99), ("1:99", 159),
                                               ("1-00:60", 90000)])
def test_fields_past_59_only_from_slurm(text: str, seconds: int) -> None:
    with pytest.raises(ValueError, match="0-59"):
        parse_duration(text)
    assert parse_duration(text, strict=False) == seconds
    assert parse_duration_s(text) == seconds


def test_minutes_of_mm_ss_may_pass_59() -> None:
    assert parse_duration("120:30") == 7230


def test_slurm_reader_keeps_its_no_value_words() -> None:
    for word in ("UNLIMITED", "INFINITE", "PARTITION_LIMIT", "NOT_SET", "INVALID", "N/A", ""):
        assert parse_duration_s(word) is None
    with pytest.raises(ValueError, match="not a Slurm duration"):
        parse_duration_s("soon")


@given(st.integers(min_value=1, max_value=10 * 365 * 86400))
def test_format_reads_back(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


@given(st.integers(0, 400), st.integers(0, 23), st.integers(0, 59), st.integers(0, 59))
def test_clock_and_unit_forms_agree(d: int, h: int, m: int, s: int) -> None:
    want = ((d * 24 + h) * 60 + m) * 60 + s
    assert parse_duration(f"{d}-{h:02d}:{m:02d}:{s:02d}") == want
    assert parse_duration(f"{d}d{h}h{m}m{s}s") == want
    assert parse_duration_s(f"{d}-{h:02d}:{m:02d}:{s:02d}") == want


def test_the_budget_reads_a_stored_limit_with_the_same_reader() -> None:
    import json
    from types import SimpleNamespace
    from typing import Any

    from broker.money.budgets import job_size

    def size(limit: object) -> int:
        job: Any = SimpleNamespace(spec_json=json.dumps({"nodes": 2, "gpus_per_node": 4, "time_limit": limit}))
        return job_size(job).time_limit_s

    assert size("7200s") == 7200
    assert size("2h") == 7200
    assert size("nonsense") == 0
