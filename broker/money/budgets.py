"""Where a group stands against its budget: spent, reserved, left. Read-only queries.

Definitions used everywhere (admission, the ledger tick, reports):

* spent     = the group's charges whose period starts inside the semester;
* reserved  = for each of the group's jobs whose charges are not all in yet:
              what was reserved at admission minus what it has been charged
              so far (never below zero); a job that was reclaimed or failed and
              goes on holds at least one more full attempt at its current price;
* committed = spent + reserved: the money that is gone or promised.

Admission refuses a job when committed + its estimate would pass the amount,
so twenty submissions at once cannot overspend. Reservations always count
against the semester in force now (that is when the money will be spent).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, case, exists, func, or_, select
from sqlalchemy.orm import Session

from broker.caller import Caller
from broker.spec import account_name
from broker.config import Settings
from broker.db.ledger_models import (
    QuotaLimit,
    Budget,
    Charge,
    GroupMember,
    LabGroup,
    Quota,
    ReservationRelease,
    Semester,
)
from broker.db.models import Attempt, Job
from broker.durations import parse_duration
from broker.errors import NotFound
from broker.amount import format_money
from broker.money.charging import billable_limit_s, estimate_micros
from broker.money.pricing import PriceBook
from broker.states import TERMINAL, AttemptState, JobState

DEFAULT_THRESHOLDS = (50, 80, 100)


# -- lookups --------------------------------------------------------------------
def semester_at(s: Session, at: datetime) -> Semester | None:
    return s.execute(_SEMESTER_AT, {"at": at}).scalar_one_or_none()


# Lookups admission makes at every submission, built once: building a statement costs
# more than running it (the values come with each run).
_SEMESTER_AT = select(Semester).where(Semester.starts_at <= bindparam("at"), Semester.ends_at > bindparam("at"))


def semester_named(s: Session, name: str) -> Semester:
    sem = s.execute(select(Semester).where(Semester.name == name)).scalar_one_or_none()
    if sem is None:
        known = ", ".join(s.execute(select(Semester.name).order_by(Semester.starts_at)).scalars()) or "none yet"
        raise NotFound(f"no semester {name!r} (known: {known})", hint="`gbroker semester list` shows them")
    return sem


def semester_cuts(s: Session) -> list[datetime]:
    """Every semester boundary: charges are cut there so each line belongs to one semester."""
    out: set[datetime] = set()
    for a, b in s.execute(select(Semester.starts_at, Semester.ends_at)).all():
        out.update((a, b))
    return sorted(out)


def group_named(s: Session, name: str) -> LabGroup:
    """The group called ``name``, in any letter case (group and account names ignore case, as Slurm's do)."""
    g = s.execute(select(LabGroup).where(LabGroup.name == account_name(name))).scalar_one_or_none()
    if g is None:
        known = ", ".join(s.execute(select(LabGroup.name).order_by(LabGroup.name)).scalars()) or "none yet"
        raise NotFound(f"no group {name!r} (known: {known})", hint="`gbroker group list` shows them")
    return g


def group_of_account(s: Session, account: str) -> LabGroup | None:
    """The group charged for Slurm account ``account``; compared as Slurm compares (ignoring case)."""
    return s.execute(_GROUP_OF_ACCOUNT, {"account": account_name(account)}).scalar_one_or_none()


_GROUP_OF_ACCOUNT = select(LabGroup).where(LabGroup.slurm_account == bindparam("account"))


def members(s: Session, group_id: int) -> list[str]:
    return list(s.execute(_MEMBERS, {"group_id": group_id}).scalars())


_MEMBERS = (select(GroupMember.user_name).where(GroupMember.group_id == bindparam("group_id"))
            .order_by(GroupMember.user_name))


def visible_groups(s: Session, caller: Caller) -> list[LabGroup]:
    """Admins see every group; a user sees the groups they are a member of."""
    q = select(LabGroup).order_by(LabGroup.name)
    if not caller.is_admin:
        q = q.where(
            exists().where(GroupMember.group_id == LabGroup.id, GroupMember.user_name == caller.name)
        )
    return list(s.execute(q).scalars())


def quota_of(s: Session, group_id: int) -> Quota | None:
    return s.get(Quota, group_id)


def budget_of(s: Session, group_id: int, semester_id: int) -> Budget | None:
    return s.execute(_BUDGET_OF, {"group_id": group_id, "semester_id": semester_id}).scalar_one_or_none()


_BUDGET_OF = select(Budget).where(Budget.group_id == bindparam("group_id"),
                                  Budget.semester_id == bindparam("semester_id"))


def parse_thresholds(text: str) -> list[int]:
    return sorted({int(t) for t in text.split(",") if t.strip()})


# -- jobs -----------------------------------------------------------------------
@dataclass(frozen=True)
class JobSize:
    gpus: int
    time_limit_s: int


def job_size(job: Job) -> JobSize:
    return _size_of(job.spec_json)


def _size_of(spec_json: str) -> JobSize:
    data = json.loads(spec_json)
    gpus = int(data.get("nodes", 1)) * int(data.get("gpus_per_node", 1))
    try:
        seconds = parse_duration(str(data.get("time_limit", "0s")))  # stored as "<seconds>s"
    except ValueError:
        seconds = 0
    return JobSize(gpus, seconds)


def attempt_estimate(book: PriceBook, partition: str, capacity: str, size: JobSize, now: datetime) -> int | None:
    """Most one attempt can cost: GPUs x the Slurm limit x the highest price in force meanwhile."""
    limit = billable_limit_s(size.time_limit_s)
    price = book.max_price(partition, capacity, now, now + timedelta(seconds=limit))
    if price is None:
        return None
    return estimate_micros(size.gpus, limit, price)


def charged_by_job(s: Session, job_ids: list[int]) -> dict[int, int]:
    if not job_ids:
        return {}
    rows = s.execute(
        select(Charge.job_id, func.sum(Charge.amount_micros)).where(Charge.job_id.in_(job_ids)).group_by(Charge.job_id)
    ).all()
    return {int(j): int(t or 0) for j, t in rows if j is not None}


def _holdings_query() -> Any:
    """What an account's jobs whose reservation still counts (not yet fully charged) hold: the
    plain rule added up, and the jobs that go on; the account is the ``account`` parameter.

    Plain rule: what each holds is reserved minus charged so far, never below zero. The jobs
    that were reclaimed or failed and go on hold at least one more attempt: they are read."""
    charged = (select(func.coalesce(func.sum(Charge.amount_micros), 0))
               .where(Charge.job_id == Job.id).scalar_subquery())
    # released_at is set with the release row; both are asked, the column finds the rows (an index).
    unreleased = [Job.group_name == bindparam("account"), Job.released_at.is_(None),
                  ~exists().where(ReservationRelease.job_id == Job.id)]
    goes_on = (Job.state.not_in(list(TERMINAL)) & or_(Job.reclaims > 0, Job.failures > 0)
               & (func.coalesce(Job.reserved_micros, 0) > 0))
    rows = select(Job.id, Job.partition, Job.capacity, Job.spec_json,
                  (func.coalesce(Job.reserved_micros, 0) - charged).label("left"), goes_on.label("goes_on")
                  ).where(*unreleased).subquery()
    held = case((rows.c.left > 0, rows.c.left), else_=0)
    # One query: the group with no key is the plain rule, added up; each job that goes on is a group
    # of its own (its id), read with what prices its next attempt.
    key = case((rows.c.goes_on, rows.c.id), else_=None)
    return select(key, func.max(rows.c.partition), func.max(rows.c.capacity), func.max(rows.c.spec_json),
                  func.coalesce(func.sum(held), 0)).group_by(key)


_HOLDINGS = _holdings_query()
"""Made once: admission asks at every submission, and building it costs more than running it."""


def holdings(s: Session, account: str) -> list[tuple[Any, ...]]:
    """The account's holdings as the database adds them up: (None, ..., plain total) and one row
    per job that goes on (its id, partition, capacity, spec, what it keeps); priced by ``reserved_micros``."""
    return [tuple(row) for row in s.execute(_HOLDINGS, {"account": account})]


def reserved_micros(s: Session, account: str, book: PriceBook, settings: Settings, now: datetime,
                    rows: list[tuple[Any, ...]] | None = None) -> int:
    """Money the account's jobs still hold against its budget (see the module docstring).

    The database adds up the plain rule over all of them; only the jobs that go on after
    a reclaim or a failure (few) are read, to price their next attempt. ``rows``: the
    account's ``holdings`` as admission keeps them (broker/money/totals.py), else asked."""
    total = 0
    for key, partition, capacity, text, kept in (holdings(s, account) if rows is None else rows):
        if key is None:  # the plain rule, over all the others
            total += int(kept)
            continue
        again = attempt_estimate(book, partition or settings.partition_for(capacity.value), capacity.value,
                                 _size_of(text), now)
        total += max(int(kept), again) if again is not None else int(kept)
    return total


# -- status ---------------------------------------------------------------------
def spent_micros(s: Session, account: str, semester: Semester) -> int:
    return int(s.execute(_SPENT, {"account": account, "starts": semester.starts_at,
                                  "ends": semester.ends_at}).scalar_one())


_SPENT = select(func.coalesce(func.sum(Charge.amount_micros), 0)).where(
    Charge.account == bindparam("account"), Charge.period_start >= bindparam("starts"),
    Charge.period_start < bindparam("ends"))


@dataclass(frozen=True)
class BudgetStatus:
    group: str
    account: str
    semester: str
    budget_id: int
    amount_micros: int
    spent_micros: int
    reserved_micros: int
    current: bool
    """True when the semester is in force now (reservations count only then)."""

    @property
    def committed_micros(self) -> int:
        return self.spent_micros + self.reserved_micros

    @property
    def left_micros(self) -> int:
        return self.amount_micros - self.committed_micros

    @property
    def exhausted(self) -> bool:
        """Spend reached 100 % of the amount."""
        return self.spent_micros >= self.amount_micros

    @property
    def over(self) -> bool:
        """At the limit: spent it all, or promised more than the amount (after a budget cut)."""
        return self.exhausted or self.committed_micros > self.amount_micros

    def pct_spent(self) -> float:
        # For display only; decisions compare integers.
        return 100.0 * self.spent_micros / self.amount_micros if self.amount_micros else 100.0

    def crossed(self, threshold_pct: int) -> bool:
        return self.spent_micros * 100 >= threshold_pct * self.amount_micros

    def as_dict(self) -> dict[str, object]:
        return {
            "group": self.group,
            "account": self.account,
            "semester": self.semester,
            "amount_micros": self.amount_micros,
            "spent_micros": self.spent_micros,
            "reserved_micros": self.reserved_micros,
            "committed_micros": self.committed_micros,
            "left_micros": self.left_micros,
            "amount": format_money(self.amount_micros),
            "spent": format_money(self.spent_micros),
            "reserved": format_money(self.reserved_micros),
            "left": format_money(self.left_micros),
            "pct_spent": round(self.pct_spent(), 2),
            "at_limit": self.over,
            "exhausted": self.exhausted,
        }


def budget_status(
    s: Session,
    group: LabGroup,
    semester: Semester,
    budget: Budget,
    book: PriceBook,
    settings: Settings,
    now: datetime,
    rows: list[tuple[Any, ...]] | None = None,
) -> BudgetStatus:
    current = semester.starts_at <= now < semester.ends_at
    reserved = 0
    if current:
        reserved = reserved_micros(s, group.slurm_account, book, settings, now, rows)
    return BudgetStatus(
        group=group.name,
        account=group.slurm_account,
        semester=semester.name,
        budget_id=budget.id,
        amount_micros=budget.amount_micros,
        spent_micros=spent_micros(s, group.slurm_account, semester),
        reserved_micros=reserved,
        current=current,
    )


@dataclass(frozen=True)
class InFlight:
    """GPUs of an account's queued and running jobs, one row per (capacity, partition).

    A job counts where it is placed now. A job being moved (its attempt is ``moving`` until
    Slurm has requeued it) is placed where it goes when the move is decided
    (``lifecycle.attempt_moving``), so it counts there already: the quota is checked once, at
    the decision, and two moves must not both fit into the same room."""

    rows: tuple[tuple[Any, str | None, int], ...]
    moving_off_ondemand: int = 0
    """GPUs of jobs being moved off on-demand (to owned or reserved capacity): they run there
    until Slurm has requeued them, so the on-demand count keeps them until then."""

    @property
    def total(self) -> int:
        return sum(gpus for *_, gpus in self.rows)

    @property
    def ondemand(self) -> int:
        placed = sum(gpus for capacity, _, gpus in self.rows if capacity.value == "ondemand")
        return placed + self.moving_off_ondemand

    def by(self, settings: Settings) -> dict[tuple[str, str], int]:
        """Per ('class', class) and per ('gpu', type); a job's GPU type is its pool's."""
        out: dict[tuple[str, str], int] = {}
        for capacity, partition, gpus in self.rows:
            out[("class", capacity.value)] = out.get(("class", capacity.value), 0) + gpus
            pool = settings.pool_of(partition or "")
            if pool is not None and pool.gpu_type:
                out[("gpu", pool.gpu_type)] = out.get(("gpu", pool.gpu_type), 0) + gpus
        return out


def in_flight(s: Session, account: str) -> InFlight:
    """The account's GPUs in flight, added up by the database in one query (plus one for any row
    stored without its GPU count, by an older gbroker: those count what their spec says)."""
    summed, unsized, moving = _IN_FLIGHT
    rows = [(c, p, int(g)) for c, p, g in s.execute(summed, {"account": account})]
    for c, p, text in s.execute(unsized, {"account": account}):
        rows.append((c, p, _size_of(text).gpus))
    off_ondemand = 0
    for placed, placed_in, runs_on, runs_in, gpus, text in s.execute(moving, {"account": account}):
        if placed.value == "ondemand":
            continue  # counted where it goes
        # Runs on on-demand until requeued; or a move stored before moves named their target
        # (the job's placement unchanged): those all went to on-demand (as reconcile reads them).
        if runs_on.value == "ondemand" or placed_in == runs_in:
            off_ondemand += int(gpus) if gpus is not None else _size_of(text).gpus
    return InFlight(tuple(rows), off_ondemand)


def gpus_in_flight(s: Session, account: str) -> tuple[int, int]:
    """(all, on-demand) GPUs of the account's jobs that are queued or running (see ``InFlight``)."""
    flight = in_flight(s, account)
    return flight.total, flight.ondemand


def _in_flight_queries() -> tuple[Any, Any, Any]:
    # Named as the states it takes (not "not ended"), so the (group_name, state) index finds them.
    live = [Job.group_name == bindparam("account"), Job.state.in_(sorted(set(JobState) - TERMINAL))]
    by = (Job.capacity, Job.partition)
    # Only a running job can be moving (or one whose state Slurm cannot tell now): the group's
    # running jobs are looked at, never its queue.
    moving = (select(Job.capacity, Job.partition, Attempt.capacity, Attempt.partition, Job.gpus, Job.spec_json)
              .join(Attempt, Attempt.job_id == Job.id)
              .where(Job.group_name == bindparam("account"), Job.state.in_([JobState.RUNNING, JobState.UNKNOWN]),
                     Attempt.state == AttemptState.MOVING))
    return (select(*by, func.sum(Job.gpus)).where(*live, Job.gpus.is_not(None)).group_by(*by),
            select(*by, Job.spec_json).where(*live, Job.gpus.is_(None)), moving)


_IN_FLIGHT = _in_flight_queries()
"""Made once: admission asks at every submission."""


def quota_limits(s: Session, group_id: int) -> dict[tuple[str, str], int]:
    """(kind, name) -> most GPUs at once: ('class', 'spot'), ('gpu', 'a100')..."""
    rows = s.execute(_QUOTA_LIMITS, {"group_id": group_id}).scalars()
    return {(r.kind, r.name): r.max_gpus for r in rows}


_QUOTA_LIMITS = select(QuotaLimit).where(QuotaLimit.group_id == bindparam("group_id"))


def gpus_in_flight_by(s: Session, account: str, settings: Settings) -> dict[tuple[str, str], int]:
    """GPUs of the account's queued and running jobs, per ('class', class) and per ('gpu', type)
    (see ``InFlight.by``)."""
    return in_flight(s, account).by(settings)


def pool_quota_full(s: Session, account: str, settings: Settings, gpus: int, to_partition: str,
                    from_partition: str) -> str | None:
    """Why a running job of ``gpus`` GPUs moving from ``from_partition`` to ``to_partition`` would
    pass one of its group's limits per capacity class or per GPU type (``quota set --class-gpus
    / --type-gpus``); None when it fits. The job already counts where it runs, so a limit the
    two pools share (the same class, the same GPU type) is not passed by the move."""
    group = group_of_account(s, account)
    if group is None:
        return None
    limits = quota_limits(s, group.id)
    to, frm = settings.pool_of(to_partition), settings.pool_of(from_partition)
    if not limits or to is None:
        return None
    wanted = []
    if frm is None or frm.capacity != to.capacity:
        wanted.append(("class", to.capacity))
    if to.gpu_type and (frm is None or frm.gpu_type != to.gpu_type):
        wanted.append(("gpu", to.gpu_type))
    in_use = in_flight(s, account).by(settings)
    for key in wanted:
        limit = limits.get(key)
        if limit is not None and in_use.get(key, 0) + gpus > limit:
            name = "on-demand" if key == ("class", "ondemand") else key[1]
            return (f"group {group.name}'s quota is {limit} {name} GPUs at once, {in_use.get(key, 0)} are "
                    f"queued or running there and this job needs {gpus}")
    return None


def ondemand_quota_full(s: Session, account: str, gpus: int) -> str | None:
    """Why ``gpus`` more GPUs on on-demand would pass the on-demand quota of the
    account's group (a job moving there from spot); None when they fit."""
    group = group_of_account(s, account)
    if group is None:
        return None
    quota = quota_of(s, group.id)
    if quota is None or quota.max_ondemand_gpus is None:
        return None
    _, ondemand = gpus_in_flight(s, account)
    if ondemand + gpus <= quota.max_ondemand_gpus:
        return None
    return (
        f"group {group.name}'s on-demand quota is {quota.max_ondemand_gpus} GPUs at once, "
        f"{ondemand} are queued or running there and this job needs {gpus}"
    )
