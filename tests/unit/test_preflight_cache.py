"""The pre-flight cache (broker.jobs.submit): a pass vouches for a while, and the cache stays bounded."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from broker.jobs import submit

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def test_a_pass_vouches_for_its_time_to_live() -> None:
    cache: dict[tuple[object, ...], datetime] = {}
    submit.remember_pass(cache, ("alice", 1), T0)
    assert cache == {("alice", 1): T0 + submit.PREFLIGHT_TTL}


def test_a_user_varying_every_submission_cannot_grow_it_without_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(submit, "PREFLIGHT_KEEP", 100)
    cache: dict[tuple[object, ...], datetime] = {}
    for i in range(50):  # passes that have expired by the time the rest arrive
        submit.remember_pass(cache, ("old", i), T0)
    later = T0 + submit.PREFLIGHT_TTL + timedelta(seconds=1)
    for mem in range(1_000):
        submit.remember_pass(cache, ("mallory", mem), later + timedelta(seconds=mem))
    assert 90 <= len(cache) <= 100
    assert not any(k[0] == "old" for k in cache)
    assert sorted(k[1] for k in cache) == list(range(1_000 - len(cache), 1_000))  # the newest are kept
