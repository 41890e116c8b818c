"""Burn rate and run-out date: at the pace of the recent window, when is the budget gone?

The rate counts the charges whose period lies in the window plus what the
group's running attempts have cost so far inside it (they are charged only
when they end, but the money is being spent now). Exact arithmetic
(``Fraction``) until the final rounding for display.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from fractions import Fraction
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from broker.db.ledger_models import Charge, Semester
from broker.db.models import Attempt, Job
from broker.amount import cost_micros, format_money
from broker.money import budgets as B
from broker.money.pricing import PriceBook
from broker.states import ATTEMPT_RUNNING

DEFAULT_WINDOW = timedelta(days=7)
SECONDS_PER_DAY = 86_400
MAX_HORIZON_S = 10 * 365 * SECONDS_PER_DAY
"""A run-out further away than this is shown as this (a trickle of spend)."""


@dataclass(frozen=True)
class Forecast:
    window_s: int
    burn_micros_per_day: int
    running_micros: int
    """Cost so far of attempts still running (not charged yet)."""
    runout_at: datetime | None
    """When the money left is gone at this rate; None = no spending in the window."""
    before_semester_end: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "window_days": round(self.window_s / SECONDS_PER_DAY, 3),
            "burn_micros_per_day": self.burn_micros_per_day,
            "burn_per_day": format_money(self.burn_micros_per_day),
            "running_micros": self.running_micros,
            "running": format_money(self.running_micros),
            "runout_at": self.runout_at.strftime("%Y-%m-%dT%H:%M:%SZ") if self.runout_at else None,
            "runs_out_before_semester_end": self.before_semester_end,
        }


def running_cost(
    s: Session, account: str, book: PriceBook, now: datetime, since: datetime | None = None
) -> int:
    """What the account's running attempts have cost so far (from ``since`` when given)."""
    q = (
        select(Attempt, Job)
        .join(Job, Job.id == Attempt.job_id)
        .where(Job.group_name == account, Attempt.state.in_(sorted(ATTEMPT_RUNNING)), Attempt.started_at.is_not(None))
    )
    total = 0
    for att, job in s.execute(q).all():
        assert att.started_at is not None
        start = att.started_at if since is None else max(att.started_at, since)
        seconds = int((now - start).total_seconds())
        if seconds <= 0:
            continue
        price = book.price_at(att.partition or "", att.capacity.value, now)
        if price is not None:
            total += cost_micros(price, seconds, B.job_size(job).gpus)
    return total


def forecast(
    s: Session,
    account: str,
    semester: Semester,
    amount_micros: int,
    spent_micros: int,
    book: PriceBook,
    now: datetime,
    window: timedelta = DEFAULT_WINDOW,
) -> Forecast:
    end = min(now, semester.ends_at)
    start = max(semester.starts_at, end - window)
    window_s = max(0, int((end - start).total_seconds()))
    in_window = s.execute(
        select(func.coalesce(func.sum(Charge.amount_micros), 0)).where(
            Charge.account == account, Charge.period_start >= start, Charge.period_start < end
        )
    ).scalar_one()
    current = semester.starts_at <= now < semester.ends_at
    running_all = running_cost(s, account, book, now) if current else 0
    running_window = running_cost(s, account, book, now, since=start) if current else 0
    rate = Fraction(int(in_window) + running_window, window_s) if window_s else Fraction(0)
    left = amount_micros - spent_micros - running_all
    runout: datetime | None = None
    before_end = False
    if current and rate > 0:
        seconds = min(max(Fraction(0), Fraction(left) / rate), Fraction(MAX_HORIZON_S))
        runout = now + timedelta(seconds=int(seconds))
        before_end = runout < semester.ends_at
    return Forecast(
        window_s=window_s,
        burn_micros_per_day=round(rate * SECONDS_PER_DAY),
        running_micros=running_all,
        runout_at=runout,
        before_semester_end=before_end,
    )
