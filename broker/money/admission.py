"""Admission at submit: membership, quota and budget checks, and the money reserved for the job.

Called inside the submit transaction, under the daemon's write lock, so the
check and the reservation are one step: twenty submissions at once cannot
overspend (each sees the reservations of those admitted before it). What the
group's jobs hold and their GPUs in flight come from running totals kept in
memory (broker/money/totals.py), so an admission costs the same however long
the queue is.

A job of a group gbroker does not manage (no group for its Slurm account) is
admitted with its estimate and nothing reserved; a managed group without a
budget in the current semester has no money limit (quotas still apply).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from broker.caller import Caller
from broker.errors import AdmissionRefused, PermissionDenied
from broker.amount import format_money
from broker.money import budgets as B
from broker.money import pricebook
from broker.money import totals
from broker.spec import JobSpec
from broker.state import Services

CAPACITY_WORDS = {"spot": "spot", "ondemand": "on-demand"}


@dataclass(frozen=True)
class Admission:
    estimate_micros: int = 0
    """The policy's cost estimate for the job on the capacity it was placed on."""
    reserved_micros: int = 0
    """Money held against the group's budget until the job's charges land."""
    note: str = ""
    estimates: tuple[tuple[str, int | None], ...] = ()
    """The estimate on each capacity the job may run on, the placed one first (None: no price)."""
    budget: B.BudgetStatus | None = None
    """The group's budget in the current semester as the job found it (None: no budget applies)."""
    counted: bool = False
    """The group is managed: its running totals (broker/money/totals.py) count the job once stored."""


def admit(
    session: Session,
    svc: Services,
    caller: Caller,
    spec: JobSpec,
    capacity: str,
    partition: str,
    now: datetime,
) -> Admission:
    """Raise AdmissionRefused (with the numbers) or return what to reserve."""
    settings = svc.settings
    book = pricebook.load(session, settings)
    # An array is estimated whole: every task may run its full time limit on its GPUs.
    tasks = len(spec.array().chunks()) if spec.is_array else 1
    size = B.JobSize(spec.gpus * tasks, spec.time_limit_s)
    estimates: dict[str, int | None] = {capacity: B.attempt_estimate(book, partition, capacity, size, now)}
    for other in ("spot", "ondemand"):
        if other == capacity or (other == "spot" and not spec.interruptible):
            continue  # a job that must not be reclaimed has no spot figure to show
        estimates[other] = B.attempt_estimate(book, settings.partition_for(other), other, size, now)
    estimate = estimates[capacity]
    shown = tuple(estimates.items())

    group = B.group_of_account(session, spec.group)
    if group is None:
        return Admission(estimate_micros=estimate or 0, reserved_micros=0, estimates=shown)
    if not caller.is_admin and caller.name not in B.members(session, group.id):
        raise PermissionDenied(
            f"user {caller.name} is not a member of group {group.name} (Slurm account {group.slurm_account})",
            hint=f"submit with your own group, or ask a lab admin: gbroker group members {group.name} --add {caller.name}",
        )
    flight: list[B.InFlight] = []  # asked once, and only when some quota needs it

    def in_flight() -> B.InFlight:
        if not flight:
            flight.append(totals.in_flight(session, group.slurm_account))
        return flight[0]

    _check_quota(session, group, spec, capacity, in_flight)
    _check_limits(session, settings, group, spec, capacity, partition, in_flight)

    semester = B.semester_at(session, now)
    budget = B.budget_of(session, group.id, semester.id) if semester is not None else None
    if semester is None or budget is None:
        where = f"in {semester.name}" if semester is not None else "now (no semester is in force)"
        return Admission(
            estimate_micros=estimate or 0, reserved_micros=0, note=f"group {group.name} has no budget {where}",
            estimates=shown, counted=True,
        )
    if estimate is None:
        raise AdmissionRefused(
            f"group {group.name} has a budget in {semester.name}, but the price book has no price "
            f"for partition {partition} ({CAPACITY_WORDS.get(capacity, capacity)}), so the job cannot be estimated",
            hint=f"ask a lab admin to add one: gbroker price set {partition} --capacity {capacity} --price ... --from ...",
        )
    status = B.budget_status(session, group, semester, budget, book, settings, now,
                             totals.holdings(session, group.slurm_account))
    if status.exhausted or status.committed_micros + estimate > status.amount_micros:
        raise AdmissionRefused(refusal_message(status, capacity, estimates), hint=_refusal_hint(status, capacity, estimates))
    return Admission(estimate_micros=estimate, reserved_micros=estimate, estimates=shown, budget=status, counted=True)


def refusal_message(status: B.BudgetStatus, capacity: str, estimates: dict[str, int | None]) -> str:
    """'group vision: $412.30 left of $12,000.00 in 2026-fall; this job is estimated at $530.00 on on-demand, ...'"""
    left = max(0, status.left_micros)
    parts = [f"{format_money(estimates[capacity] or 0)} on {CAPACITY_WORDS.get(capacity, capacity)}"]
    for other, value in estimates.items():
        if other != capacity and value is not None:
            parts.append(f"{format_money(value)} on {CAPACITY_WORDS.get(other, other)}")
    msg = (
        f"group {status.group}: {format_money(left)} left of {format_money(status.amount_micros)} "
        f"in {status.semester}; this job is estimated at {', '.join(parts)}"
    )
    if status.exhausted:
        msg = f"group {status.group} has spent its budget ({format_money(status.spent_micros)} of " \
              f"{format_money(status.amount_micros)} in {status.semester}); new jobs are refused. " + msg
    return msg


def _refusal_hint(status: B.BudgetStatus, capacity: str, estimates: dict[str, int | None]) -> str:
    reserved = (
        f"{format_money(status.reserved_micros)} is reserved by the group's running and pending jobs "
        "and comes back as they finish; " if status.reserved_micros else ""
    )
    cheaper = [
        c for c, v in estimates.items()
        if c != capacity and v is not None and status.committed_micros + v <= status.amount_micros
    ]
    spot = "the spot estimate fits: submit with --partition spot (interruptible); " if "spot" in cheaper else ""
    return (
        f"{reserved}{spot}ask for fewer GPUs or a shorter --time, "
        f"or ask a lab admin to raise the budget (gbroker budget set {status.group} --semester {status.semester} ...)"
    )


def _check_quota(
    session: Session, group: Any, spec: JobSpec, capacity: str, in_flight: Callable[[], B.InFlight]
) -> None:
    quota = B.quota_of(session, group.id)
    if quota is None:
        return
    total, ondemand = in_flight().total, in_flight().ondemand
    if quota.max_gpus is not None and total + spec.gpus > quota.max_gpus:
        raise AdmissionRefused(
            f"group {group.name}: quota is {quota.max_gpus} GPUs at once; {total} are queued or running "
            f"and this job needs {spec.gpus}",
            hint="wait for some of the group's jobs to finish, or ask a lab admin to raise the quota "
            f"(gbroker quota set {group.name} --gpus N)",
        )
    if capacity == "ondemand" and quota.max_ondemand_gpus is not None and ondemand + spec.gpus > quota.max_ondemand_gpus:
        raise AdmissionRefused(
            f"group {group.name}: quota is {quota.max_ondemand_gpus} on-demand GPUs at once; {ondemand} are "
            f"queued or running on on-demand and this job needs {spec.gpus}",
            hint="make the job interruptible so it can run on spot, wait, or ask a lab admin to raise the quota "
            f"(gbroker quota set {group.name} --ondemand-gpus N)",
        )


def _check_limits(
    session: Session, settings: Any, group: Any, spec: JobSpec, capacity: str, partition: str,
    in_flight: Callable[[], B.InFlight],
) -> None:
    """The group's limits per capacity class and per GPU type, on the pool the policy chose."""
    limits = B.quota_limits(session, group.id)
    if not limits:
        return
    pool = settings.pool_of(partition)
    wanted = [("class", capacity)] + ([("gpu", pool.gpu_type)] if pool is not None and pool.gpu_type else [])
    in_use = in_flight().by(settings)
    for key in wanted:
        limit = limits.get(key)
        if limit is None or in_use.get(key, 0) + spec.gpus <= limit:
            continue
        kind, name = key
        what = f"{CAPACITY_WORDS.get(name, name)} GPUs" if kind == "class" else f"{name} GPUs"
        flag = "--class-gpus" if kind == "class" else "--type-gpus"
        raise AdmissionRefused(
            f"group {group.name}: quota is {limit} {what} at once; {in_use.get(key, 0)} are queued or running "
            f"and this job needs {spec.gpus} (it was placed on {partition})",
            hint="wait for some of the group's jobs to finish, ask for another GPU type (gpu = [...]), "
            f"or ask a lab admin to raise it (gbroker quota set {group.name} {flag} {name}=N)",
        )
