"""Spend reports and burn-down series, as plain dicts for the socket API.

One pass over the semester's charge lines, grouped by group, user, kind,
partition, pool or GPU type: spend, GPU-hours, spot share, money saved
against running all of it on on-demand, and money lost to reclaims. Node time
no job used is in rows of its own: idle nodes, billing rounding (the time a
pool bills beyond a power-up's real length) and stopped nodes. Every line
falls in exactly one row, so the rows add up to the total to the micro-unit
whatever the grouping. A line from before the pool catalog (no pool recorded)
counts under the pool whose partition it names, else as ``(partition X)``. Money stays in integer micro-units (``*_micros``) next to the display
strings, so a program reading the JSON gets exact numbers.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from broker.caller import Caller
from broker.config import Settings
from broker.db.ledger_models import (
    NODE_TAGS,
    TAG_IDLE,
    TAG_LOST,
    TAG_ROUNDING,
    TAG_STOPPED,
    Charge,
    LabGroup,
    Semester,
)
from broker.errors import SpecError
from broker.amount import format_money
from broker.money import budgets as B
from broker.money import pricebook
from broker.money.forecast import DEFAULT_WINDOW, forecast

BY_CHOICES = ("group", "user", "kind", "partition", "pool", "gpu")
IDLE_ROW = "(idle nodes)"
ROUNDING_ROW = "(billing rounding)"
STOPPED_ROW = "(stopped nodes)"
NODE_ROWS = {TAG_IDLE: IDLE_ROW, TAG_ROUNDING: ROUNDING_ROW, TAG_STOPPED: STOPPED_ROW}
"""Node time no job used: a row of its own per kind, whatever the grouping."""
UNTYPED = "(untyped)"
"""The GPU-type row of lines whose pool names no GPU type."""
MAX_BURN_POINTS = 500


@dataclass
class Totals:
    spend: int = 0
    gpu_s: int = 0
    spot_gpu_s: int = 0
    saved: int = 0
    lost: int = 0
    lines: int = 0

    def add(self, c: Charge) -> None:
        self.spend += c.amount_micros
        self.gpu_s += c.seconds * c.gpus
        self.lines += 1
        if c.tag in NODE_TAGS:
            return
        if c.capacity == "spot":
            self.spot_gpu_s += c.seconds * c.gpus
        self.saved += c.ondemand_micros - c.amount_micros
        if c.tag == TAG_LOST:
            self.lost += c.amount_micros

    def as_dict(self, key: str) -> dict[str, Any]:
        share = (Decimal(self.spot_gpu_s * 100) / self.gpu_s).quantize(Decimal("0.1")) if self.gpu_s else Decimal(0)
        return {
            "key": key,
            "spend_micros": self.spend,
            "spend": format_money(self.spend),
            "gpu_seconds": self.gpu_s,
            "gpu_hours": str((Decimal(self.gpu_s) / 3600).quantize(Decimal("0.01"))),
            "spot_share_pct": str(share),
            "saved_micros": self.saved,
            "saved": format_money(self.saved),
            "lost_micros": self.lost,
            "lost": format_money(self.lost),
            "lines": self.lines,
        }


def _accounts_visible(s: Session, caller: Caller) -> dict[str, str] | None:
    """account -> group name of the groups the caller may see; None = everything (admin)."""
    groups = B.visible_groups(s, caller)
    names = {g.slurm_account: g.name for g in groups}
    return None if caller.is_admin else names


def _semester_lines(s: Session, semester: Semester, accounts: dict[str, str] | None) -> list[Charge]:
    q = select(Charge).where(
        Charge.period_start >= semester.starts_at, Charge.period_start < semester.ends_at
    ).order_by(Charge.period_end, Charge.id)
    if accounts is not None:
        q = q.where(Charge.account.in_(list(accounts)))
    return list(s.execute(q).scalars())


def report(
    s: Session, caller: Caller, settings: Settings, semester_name: str | None, by: str, now: datetime
) -> dict[str, Any]:
    if by not in BY_CHOICES:
        raise SpecError(f"--by {by!r}: choose one of {', '.join(BY_CHOICES)}")
    semester = _semester(s, semester_name, now)
    visible = _accounts_visible(s, caller)
    group_names = {g.slurm_account: g.name for g in s.execute(select(LabGroup)).scalars()}
    rows: dict[str, Totals] = defaultdict(Totals)
    total = Totals()
    special = set(NODE_ROWS.values())
    for c in _semester_lines(s, semester, visible):
        if c.tag in NODE_ROWS:
            key = NODE_ROWS[c.tag]
        elif by == "group":
            key = group_names.get(c.account, c.account)
        elif by == "user":
            key = c.user_name
        elif by == "kind":
            key = c.kind
        elif by == "pool":
            key = pool_key(settings, c)
        elif by == "gpu":
            key = gpu_key(settings, c)
        else:
            key = c.partition
        rows[key].add(c)
        total.add(c)
    ordered = sorted(rows.items(), key=lambda kv: (kv[0] in special, -kv[1].spend, kv[0]))
    return {
        "semester": semester.name,
        "starts_at": _iso(semester.starts_at),
        "ends_at": _iso(semester.ends_at),
        "by": by,
        "rows": [t.as_dict(k) for k, t in ordered],
        "total": total.as_dict("total"),
        "budgets": budgets_overview(s, caller, settings, semester, now),
        "visible": "all groups" if visible is None else sorted(visible.values()),
    }


def pool_key(settings: Settings, c: Charge) -> str:
    """The pool a line counts under: the one it recorded, else the pool of its partition, else its partition."""
    if c.pool:
        return c.pool
    pool = settings.pool_of(c.partition)
    return pool.name if pool is not None else f"(partition {c.partition})"


def gpu_key(settings: Settings, c: Charge) -> str:
    """The GPU type a line counts under: the one it recorded, else its partition's pool's, else untyped."""
    if c.gpu_type:
        return c.gpu_type
    if c.pool is None:
        pool = settings.pool_of(c.partition)
        if pool is not None and pool.gpu_type:
            return pool.gpu_type
    return UNTYPED


def budgets_overview(
    s: Session, caller: Caller, settings: Settings, semester: Semester, now: datetime,
    window: timedelta = DEFAULT_WINDOW,
) -> list[dict[str, Any]]:
    book = pricebook.load(s, settings)
    out = []
    for group in B.visible_groups(s, caller):
        budget = B.budget_of(s, group.id, semester.id)
        if budget is None:
            continue
        status = B.budget_status(s, group, semester, budget, book, settings, now)
        item = status.as_dict()
        item["thresholds"] = budget.thresholds
        item["hold_pending"] = budget.hold_pending
        item["cancel_running"] = budget.cancel_running
        item["forecast"] = forecast(
            s, group.slurm_account, semester, status.amount_micros, status.spent_micros, book, now, window
        ).as_dict()
        out.append(item)
    return out


def burndown(s: Session, caller: Caller, settings: Settings, semester_name: str | None, now: datetime) -> dict[str, Any]:
    """Per visible group with a budget: remaining money over time, and the forecast line."""
    semester = _semester(s, semester_name, now)
    series = []
    for item in budgets_overview(s, caller, settings, semester, now):
        lines = _semester_lines(s, semester, {item["account"]: item["group"]})
        points = [(_iso(semester.starts_at), item["amount_micros"])]
        left = item["amount_micros"]
        step = max(1, len(lines) // MAX_BURN_POINTS)
        for i, c in enumerate(lines):
            left -= c.amount_micros
            if i % step == 0 or i == len(lines) - 1:
                points.append((_iso(c.period_end), left))
        fc = item["forecast"]
        forecast_line = []
        if semester.starts_at <= now < semester.ends_at:
            here = item["amount_micros"] - item["spent_micros"] - fc["running_micros"]
            forecast_line.append((_iso(now), here))
            if fc["runout_at"]:
                end = min(fc["runout_at"], _iso(semester.ends_at))
                forecast_line.append((end, 0 if fc["runs_out_before_semester_end"] else _left_at_end(here, fc, semester, now)))
        series.append({
            "group": item["group"], "amount_micros": item["amount_micros"], "points": points,
            "forecast": forecast_line, "runout_at": fc["runout_at"],
        })
    return {"semester": semester.name, "starts_at": _iso(semester.starts_at), "ends_at": _iso(semester.ends_at),
            "now": _iso(now), "series": series}


def _left_at_end(here: int, fc: dict[str, Any], semester: Semester, now: datetime) -> int:
    days = (semester.ends_at - now).total_seconds() / 86_400  # display only (a plot)
    return int(here - fc["burn_micros_per_day"] * days)


def _semester(s: Session, name: str | None, now: datetime) -> Semester:
    if name:
        return B.semester_named(s, name)
    sem = B.semester_at(s, now)
    if sem is None:
        raise SpecError("no semester is in force now", hint="name one with --semester (gbroker semester list)")
    return sem


def _iso(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


def charge_lines(
    s: Session, caller: Caller, *, semester_name: str | None = None, job_id: int | None = None,
    group: str | None = None, limit: int = 10_000,
) -> list[dict[str, Any]]:
    """The raw ledger lines the caller may see (for audits, tests and `gbroker budget ledger`)."""
    q = select(Charge).order_by(Charge.id).limit(max(1, min(int(limit), 100_000)))
    if semester_name:
        sem = B.semester_named(s, semester_name)
        q = q.where(Charge.period_start >= sem.starts_at, Charge.period_start < sem.ends_at)
    if job_id is not None:
        q = q.where(Charge.job_id == job_id)
    if group:
        q = q.where(Charge.account == B.group_named(s, group).slurm_account)
    visible = _accounts_visible(s, caller)
    if visible is not None:
        q = q.where(Charge.account.in_(list(visible)))
    return [
        {
            "id": c.id, "key": c.line_key, "slurm_job_id": c.slurm_job_id, "run_index": c.run_index,
            "job_id": c.job_id, "account": c.account, "user": c.user_name, "kind": c.kind,
            "partition": c.partition, "capacity": c.capacity, "pool": c.pool, "gpu_type": c.gpu_type,
            "node": c.node, "tag": c.tag,
            "period_start": _iso(c.period_start), "period_end": _iso(c.period_end), "seconds": c.seconds,
            "gpus": c.gpus, "price_micros": c.price_micros, "amount_micros": c.amount_micros,
            "ondemand_micros": c.ondemand_micros, "amount": format_money(c.amount_micros),
        }
        for c in s.execute(q).scalars()
    ]


def budget_rows(
    s: Session, caller: Caller, settings: Settings, semester_name: str | None, now: datetime,
    window_days: float = 7.0,
) -> dict[str, Any]:
    if not isinstance(window_days, (int, float)) or isinstance(window_days, bool) or not 0 < window_days <= 366:
        raise SpecError(f"--window {window_days!r}: give a number of days between 0 and 366")
    semester = _semester(s, semester_name, now)
    window = timedelta(seconds=round(window_days * 86_400))
    return {"semester": semester.name, "budgets": budgets_overview(s, caller, settings, semester, now, window)}


__all__ = ["BY_CHOICES", "budget_rows", "burndown", "charge_lines", "report"]
