"""Socket operations for semesters, groups, quotas, the price book, budgets and reports.

Every operation that changes something starts with ``caller.require_admin``:
the daemon decides from the uid the kernel reported, whatever the client
claims. Read operations show a user the groups they belong to; admins see all.
"""

from __future__ import annotations

import csv
import inspect
import io
import json
import logging
import re
from collections.abc import Callable
from datetime import UTC, datetime, tzinfo
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from broker import timeparse
from broker.caller import Caller, Handler
from broker.spec import account_name
from broker.db import store
from broker.db.ledger_models import Budget, Charge, GroupMember, LabGroup, Price, Quota, Semester
from broker.errors import SpecError
from broker.amount import format_money, parse_money
from broker.money import budgets as B
from broker.money import ledger, pricebook
from broker.money import reporting
from broker.money.pricing import ANY_PARTITION, CAPACITIES
from broker.state import Services

log = logging.getLogger(__name__)

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MAX_THRESHOLD_PCT = 1000
PRICE_CSV_COLUMNS = ("partition", "capacity", "price_per_gpu_hour", "effective_from")


def handlers(svc: Services) -> dict[str, Handler]:
    def read(fn: Callable[..., Any]) -> Handler:
        def run(caller: Caller, args: dict[str, Any]) -> Any:
            _check_args(fn, args)
            with svc.sessions() as s:
                return fn(s, svc, caller, svc.clock.now(), **args)
        return run

    def write(fn: Callable[..., Any], what: str, then: Callable[[dict[str, Any]], None] | None = None) -> Handler:
        def run(caller: Caller, args: dict[str, Any]) -> Any:
            caller.require_admin(what)  # before anything else: the daemon decides, not the CLI
            _check_args(fn, args)
            with svc.tx() as s:
                out = fn(s, svc, caller, svc.clock.now(), **args)
            if then is not None:
                then(out)  # after the commit: what follows from the change, at once
            return out
        return run

    def enforce_at_once(out: dict[str, Any]) -> None:
        """A budget cut holds the group's jobs before the answer, not at the next ledger tick:
        Slurm may start a waiting job within seconds (docs/BUDGETS.md)."""
        try:
            plan = ledger.enforce_budgets(svc, svc.clock.now())
        except Exception:  # the budget is stored; the ledger tick enforces it in a moment
            log.exception("enforcing the budgets after a change failed; the ledger tick tries again")
            return
        out["held_now"] = len(plan.hold)

    return {
        "semester_add": write(semester_add, "adding a semester"),
        "semester_list": read(semester_list),
        "group_add": write(group_add, "adding a group"),
        "group_members": write(group_members, "changing group members"),
        "group_list": read(group_list),
        "quota_set": write(quota_set, "setting quotas"),
        "quota_list": read(quota_list),
        "price_set": write(price_set, "changing the price book"),
        "price_import": write(price_import, "importing prices"),
        "price_list": read(price_list),
        "budget_set": write(budget_set, "setting budgets", then=enforce_at_once),
        "budget_list": read(budget_list),
        "report": read(report),
        "burndown": read(burndown),
        "ledger": read(ledger_lines),
    }


# -- parsing --------------------------------------------------------------------
def _check_args(fn: Callable[..., Any], args: dict[str, Any]) -> None:
    try:
        inspect.signature(fn).bind(None, None, None, None, **args)
    except TypeError as exc:
        raise SpecError(f"bad request: {exc}", hint="client and daemon versions may differ") from None


def parse_when(text: Any, now: datetime, *, field: str, end_of_day: bool = False, tz: tzinfo = UTC) -> datetime:
    """A request's time field (the forms of ``broker.timeparse``) in UTC, whole seconds.

    ``end_of_day``: a bare date means the end of that day (the first second of
    the next), as for a semester's last day.
    """
    if not isinstance(text, str) or not text.strip():
        raise SpecError(f"{field}: give a date or time, e.g. 2026-09-01 or 2026-09-01T08:00:00Z")
    try:
        when = timeparse.parse_when(text, now, end_of_day=end_of_day, tz=tz).astimezone(UTC)
    except (ValueError, OverflowError) as exc:
        raise SpecError(
            f"{field}: {text!r} is not a date or time{timeparse.why(exc)}",
            hint="write 2026-09-01, 2026-09-01T08:00:00Z, now, or +10m",
        ) from None
    return when.replace(microsecond=0)


def _name(value: Any, field: str) -> str:
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise SpecError(f"{field}: {value!r} is not a valid name",
                        hint="letters, digits, '.', '_' and '-', at most 64, starting with a letter or digit")
    return value


def _money(value: Any, field: str) -> int:
    try:
        micros = parse_money(value if isinstance(value, str) else str(value))
    except ValueError as exc:
        raise SpecError(f"{field}: {exc}", hint="write an amount like 12000 or 412.30") from None
    if micros < 0:
        raise SpecError(f"{field}: must not be negative")
    return micros


def _opt_int(value: Any, field: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SpecError(f"{field}: expected a whole number >= 0, got {value!r}")
    return value


def _iso(dt: datetime | None) -> str | None:
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ") if dt is not None else None


# -- semesters --------------------------------------------------------------------
def semester_add(s: Session, svc: Services, caller: Caller, now: datetime, *, name: str, start: str, end: str) -> dict[str, Any]:
    name = _name(name, "semester name")
    # A semester's days are the lab's: local midnight in the settings' time zone.
    zone = svc.settings.zone()
    starts = parse_when(start, now, field="start", tz=zone)
    ends = parse_when(end, now, field="end", end_of_day=True, tz=zone)
    if ends <= starts:
        raise SpecError(f"semester {name}: ends ({_iso(ends)}) before it starts ({_iso(starts)})")
    if s.execute(select(Semester).where(Semester.name == name)).scalar_one_or_none() is not None:
        raise SpecError(f"semester {name} exists already", hint="`gbroker semester list` shows it")
    clash = s.execute(
        select(Semester).where(Semester.starts_at < ends, Semester.ends_at > starts)
    ).scalars().first()
    if clash is not None:
        raise SpecError(
            f"semester {name} ({_iso(starts)} .. {_iso(ends)}) overlaps {clash.name} "
            f"({_iso(clash.starts_at)} .. {_iso(clash.ends_at)})",
            hint="semesters must not overlap; the end date is the last day (inclusive)",
        )
    sem = Semester(name=name, starts_at=starts, ends_at=ends, created_at=now)
    s.add(sem)
    s.flush()
    store.add_event(s, "semester", f"semester {name} added by {caller.name}", now=now)
    return _semester_dict(sem, now)


def _semester_dict(sem: Semester, now: datetime) -> dict[str, Any]:
    return {"name": sem.name, "starts_at": _iso(sem.starts_at), "ends_at": _iso(sem.ends_at),
            "current": sem.starts_at <= now < sem.ends_at}


def semester_list(s: Session, svc: Services, caller: Caller, now: datetime) -> list[dict[str, Any]]:
    return [_semester_dict(x, now) for x in s.execute(select(Semester).order_by(Semester.starts_at)).scalars()]


# -- groups -------------------------------------------------------------------------
def group_add(
    s: Session, svc: Services, caller: Caller, now: datetime, *, name: str, account: str | None = None,
    members: list[str] | None = None,
) -> dict[str, Any]:
    # Group and account names ignore letter case, as Slurm's account names do: stored lower-case.
    name = account_name(_name(name, "group name"))
    account = account_name(_name(account or name, "Slurm account"))
    if s.execute(select(LabGroup).where((LabGroup.name == name) | (LabGroup.slurm_account == account))).first():
        raise SpecError(f"a group named {name} or with Slurm account {account} exists already",
                        hint="`gbroker group list` shows the groups")
    group = LabGroup(name=name, slurm_account=account, created_at=now)
    s.add(group)
    s.flush()
    for user in sorted(set(members or [])):
        s.add(GroupMember(group_id=group.id, user_name=_name(user, "member")))
    s.flush()
    store.add_event(s, "group", f"group {name} (account {account}) added by {caller.name}", now=now)
    return _group_dict(s, group)


def group_members(
    s: Session, svc: Services, caller: Caller, now: datetime, *, name: str, add: list[str] | None = None,
    remove: list[str] | None = None,
) -> dict[str, Any]:
    group = B.group_named(s, name)
    current = set(B.members(s, group.id))
    for field, users in (("add", add), ("remove", remove)):
        if users is not None and (not isinstance(users, list) or not all(isinstance(u, str) for u in users)):
            raise SpecError(f"{field}: expected a list of user names", hint="e.g. --add carol --remove bob")
    both = sorted(set(add or []) & set(remove or []))
    if both:
        raise SpecError(f"{', '.join(both)}: both added and removed", hint="give each user once; nothing changed")
    absent = sorted(set(remove or []) - current)
    if absent:
        raise SpecError(f"{', '.join(absent)}: not a member of {name}, nothing to remove",
                        hint=f"{name}'s members are {', '.join(sorted(current)) or 'none'}; nothing changed")
    joined = sorted(set(add or []) - current)
    for user in joined:
        s.add(GroupMember(group_id=group.id, user_name=_name(user, "member")))
    gone = sorted(set(remove or []))
    if gone:
        s.execute(delete(GroupMember).where(GroupMember.group_id == group.id, GroupMember.user_name.in_(gone)))
    s.flush()
    store.add_event(s, "group", f"group {name} members changed by {caller.name}: +{joined} -{gone}", now=now)
    return _group_dict(s, group)


def _group_dict(s: Session, group: LabGroup) -> dict[str, Any]:
    quota = B.quota_of(s, group.id)
    return {
        "name": group.name, "account": group.slurm_account, "members": B.members(s, group.id),
        "max_gpus": quota.max_gpus if quota else None,
        "max_ondemand_gpus": quota.max_ondemand_gpus if quota else None,
        "limits": {f"{k}:{n}": v for (k, n), v in sorted(B.quota_limits(s, group.id).items())},
    }


def group_list(s: Session, svc: Services, caller: Caller, now: datetime) -> list[dict[str, Any]]:
    return [_group_dict(s, g) for g in B.visible_groups(s, caller)]


# -- quotas ----------------------------------------------------------------------------
_KEEP: Any = object()


def quota_set(
    s: Session, svc: Services, caller: Caller, now: datetime, *, group: str, max_gpus: Any = _KEEP,
    max_ondemand_gpus: Any = _KEEP, limits: Any = _KEEP,
) -> dict[str, Any]:
    """Set the limits given; a limit not given stays as it was; None removes it.

    ``limits``: {"class:spot": 16, "gpu:a100": None, ...}: GPUs at once per capacity
    class or GPU type (None removes that limit)."""
    g = B.group_named(s, group)
    if limits is not _KEEP:
        spelled = {p.gpu_type.lower(): p.gpu_type for p in svc.settings.catalog().pools if p.gpu_type}
        _set_limits(s, g.id, limits, now, spelled)
    quota = s.get(Quota, g.id)
    if quota is None:
        quota = Quota(group_id=g.id, max_gpus=None, max_ondemand_gpus=None, updated_at=now)
        s.add(quota)
    if max_gpus is not _KEEP:
        quota.max_gpus = _opt_int(max_gpus, "--gpus")
    if max_ondemand_gpus is not _KEEP:
        quota.max_ondemand_gpus = _opt_int(max_ondemand_gpus, "--ondemand-gpus")
    quota.updated_at = now
    s.flush()
    store.add_event(s, "quota", f"group {group} quota: {quota.max_gpus} GPUs, {quota.max_ondemand_gpus} "
                    f"on-demand (by {caller.name})", now=now)
    return _group_dict(s, g)


LIMIT_KINDS = {"class": "--class-gpus", "gpu": "--type-gpus"}


def _set_limits(s: Session, group_id: int, limits: Any, now: datetime, gpu_types: dict[str, str]) -> None:
    """``gpu_types``: the catalog's GPU types, lower-cased to as the catalog spells them."""
    from broker.db.ledger_models import QuotaLimit
    from broker.pools import CLASSES

    if not isinstance(limits, dict) or len(limits) > 64:
        raise SpecError("limits: expected a table of 'class:NAME' or 'gpu:NAME' to a GPU count (at most 64)")
    for key, value in limits.items():
        kind, _, name = str(key).partition(":")
        if kind not in LIMIT_KINDS or not name:
            raise SpecError(f"quota limit {key!r}: write class:NAME or gpu:NAME", hint="e.g. --class-gpus spot=16")
        if kind == "class" and name not in CLASSES:
            raise SpecError(f"{LIMIT_KINDS[kind]} {name}: not a capacity class; the classes are {', '.join(CLASSES)}")
        name = _name(name, LIMIT_KINDS[kind])
        count = _opt_int(value, LIMIT_KINDS[kind])
        if count is None:  # removed, however it was spelled, even for a type no pool has any more
            s.execute(delete(QuotaLimit).where(QuotaLimit.group_id == group_id, QuotaLimit.kind == kind,
                                               func.lower(QuotaLimit.name) == name.lower()))
            continue
        if kind == "gpu":
            # As the catalog spells it: admission compares the pool's type exactly.
            if name.lower() not in gpu_types:
                raise SpecError(f"{LIMIT_KINDS[kind]} {name}: no pool has that GPU type",
                                hint=("the pools' types are " + ", ".join(sorted(gpu_types.values()))) if gpu_types
                                else "no pool declares a gpu_type ([pools.NAME] gpu_type in the settings)")
            name = gpu_types[name.lower()]
        row = s.get(QuotaLimit, (group_id, kind, name))
        if row is None:
            s.add(QuotaLimit(group_id=group_id, kind=kind, name=name, max_gpus=count, updated_at=now))
        else:
            row.max_gpus, row.updated_at = count, now
    s.flush()


def quota_list(s: Session, svc: Services, caller: Caller, now: datetime) -> list[dict[str, Any]]:
    out = []
    for g in B.visible_groups(s, caller):
        item = _group_dict(s, g)
        flight = B.in_flight(s, g.slurm_account)
        item["in_use_gpus"], item["in_use_ondemand_gpus"] = flight.total, flight.ondemand
        item["in_use_by"] = {f"{k}:{n}": v for (k, n), v in sorted(flight.by(svc.settings).items())}
        out.append(item)
    return out


# -- prices ------------------------------------------------------------------------------
def _price_row(partition: Any, capacity: Any, price: Any, effective: Any, now: datetime, where: str,
               known: set[str] | None = None) -> Price:
    if partition != ANY_PARTITION:
        partition = _name(partition, f"{where}partition")
        if known is not None and partition not in known:
            raise SpecError(f"{where}partition {partition!r} is not one gbroker places jobs in",
                            hint=f"the partitions are {', '.join(sorted(known))}, or * for every partition of "
                                 "that capacity")
    if capacity not in CAPACITIES:
        raise SpecError(f"{where}capacity {capacity!r}: use one of {', '.join(CAPACITIES)}")
    micros = _money(price, f"{where}price")
    when = parse_when(effective, now, field=f"{where}effective from")
    return Price(partition=partition, capacity=capacity, price_micros=micros, effective_at=when,
                 created_at=now, note="")


def _store_prices(s: Session, rows: list[Price], caller: Caller, now: datetime) -> dict[str, Any]:
    added, unchanged = [], 0
    for row in rows:
        same = s.execute(select(Price).where(
            Price.partition == row.partition, Price.capacity == row.capacity, Price.effective_at == row.effective_at
        )).scalar_one_or_none()
        if same is not None:
            if same.price_micros == row.price_micros:
                unchanged += 1
                continue
            raise SpecError(
                f"{row.partition} ({row.capacity}) already has a price from {_iso(row.effective_at)}: "
                f"{format_money(same.price_micros)} per GPU-hour",
                hint="prices are never rewritten; give the new price a later effective time",
            )
        charged_after = s.execute(select(Charge.period_end).where(
            Charge.capacity == row.capacity,
            Charge.period_end > row.effective_at,
            *(() if row.partition == ANY_PARTITION else (Charge.partition == row.partition,)),
        ).order_by(Charge.period_end.desc()).limit(1)).scalar_one_or_none()
        if charged_after is not None:
            raise SpecError(
                f"{row.partition} ({row.capacity}): charges were already made at the old price until "
                f"{_iso(charged_after)}; a price cannot take effect before that ({_iso(row.effective_at)})",
                hint=f"give --from {_iso(charged_after)} or later"
                     + (", e.g. now" if now >= charged_after else
                        " (charges run past now when billing rounds a run up, or a run is charged ahead)"),
            )
        s.add(row)
        added.append(row)
    s.flush()
    for row in added:
        store.add_event(s, "price", f"{row.partition} ({row.capacity}): {format_money(row.price_micros)} per "
                        f"GPU-hour from {_iso(row.effective_at)} (by {caller.name})", now=now)
    return {"added": [_price_dict(p) for p in added], "unchanged": unchanged}


def price_set(
    s: Session, svc: Services, caller: Caller, now: datetime, *, partition: str, capacity: str, price: str,
    effective: str = "now",
) -> dict[str, Any]:
    known = _priced_partitions(svc)
    return _store_prices(s, [_price_row(partition, capacity, price, effective, now, "", known)], caller, now)


def _priced_partitions(svc: Services) -> set[str]:
    """The partitions a price may name: the catalog's and those whose nodes gbroker manages."""
    return set(svc.settings.partitions) | set(svc.settings.managed_node_partitions())


def parse_price_csv(text: str, now: datetime, known: set[str] | None = None) -> list[Price]:
    """The price book CSV: a header naming partition,capacity,price_per_gpu_hour,effective_from."""
    reader = csv.DictReader(io.StringIO(text))
    header = [h.strip().lower() for h in (reader.fieldnames or [])]
    missing = [c for c in PRICE_CSV_COLUMNS if c not in header]
    if missing:
        raise SpecError(f"price CSV: missing column(s) {', '.join(missing)}",
                        hint="the first line must be: " + ",".join(PRICE_CSV_COLUMNS))
    unknown = [c for c in header if c not in PRICE_CSV_COLUMNS]
    if unknown:
        raise SpecError(f"price CSV: unknown column(s) {', '.join(repr(c) for c in unknown)}",
                        hint="the columns are " + ",".join(PRICE_CSV_COLUMNS) + " (prices are in the settings' "
                             "currency); nothing was imported")
    rows, problems = [], []
    for n, raw in enumerate(reader, start=2):
        if None in raw:  # more fields than the header names
            problems.append(f"line {n}: {len(PRICE_CSV_COLUMNS) + len(raw[None])} fields, the header names "
                            f"{len(PRICE_CSV_COLUMNS)}")
            continue
        rec = {(k or "").strip().lower(): (v or "").strip() for k, v in raw.items()}
        if not any(rec.values()):
            continue
        try:
            rows.append(_price_row(rec["partition"], rec["capacity"], rec["price_per_gpu_hour"],
                                   rec["effective_from"], now, f"line {n}: ", known))
        except SpecError as exc:
            problems.append(exc.message)
    if problems:
        raise SpecError("price CSV has problems (nothing was imported):\n  " + "\n  ".join(problems[:20]),
                        hint="fix the lines named and import again")
    if not rows:
        raise SpecError("price CSV has no rows")
    return rows


def price_import(s: Session, svc: Services, caller: Caller, now: datetime, *, csv_text: str) -> dict[str, Any]:
    if not isinstance(csv_text, str):
        raise SpecError("price import: expected the CSV text")
    return _store_prices(s, parse_price_csv(csv_text, now, _priced_partitions(svc)), caller, now)


def _price_dict(p: Price) -> dict[str, Any]:
    return {"partition": p.partition, "capacity": p.capacity, "price_micros": p.price_micros,
            "price": format_money(p.price_micros), "effective_from": _iso(p.effective_at)}


def price_list(s: Session, svc: Services, caller: Caller, now: datetime) -> list[dict[str, Any]]:
    rows = list(s.execute(select(Price).order_by(Price.partition, Price.capacity, Price.effective_at)).scalars())
    in_force: dict[tuple[str, str], int] = {}
    for p in rows:
        if p.effective_at <= now:
            in_force[(p.partition, p.capacity)] = p.id  # the latest one not in the future
    return [dict(_price_dict(p), in_force=in_force.get((p.partition, p.capacity)) == p.id) for p in rows]


# -- budgets -------------------------------------------------------------------------------
def _thresholds(value: Any) -> str:
    items = value if isinstance(value, list) else str(value).split(",")
    texts = [str(v).strip().removesuffix("%").strip() for v in items if str(v).strip()]
    if not all(t.isascii() and t.isdigit() for t in texts):  # int() would take 1_0 and other scripts' digits
        raise SpecError(f"thresholds {value!r}: write whole percentages like 50,80,100")
    pcts = sorted({int(t) for t in texts})
    if not pcts or any(p <= 0 or p > MAX_THRESHOLD_PCT for p in pcts):
        raise SpecError(f"thresholds {value!r}: each between 1 and {MAX_THRESHOLD_PCT}")
    return ",".join(str(p) for p in pcts)


def budget_set(
    s: Session, svc: Services, caller: Caller, now: datetime, *, group: str, semester: str, amount: str | None = None,
    thresholds: Any = None, hold_pending: bool | None = None, cancel_running: bool | None = None,
    alert_command: list[str] | None = None, alert_url: str | None = None,
) -> dict[str, Any]:
    g = B.group_named(s, group)
    sem = B.semester_named(s, semester)
    budget = B.budget_of(s, g.id, sem.id)
    if budget is None:
        if amount is None:
            raise SpecError(f"group {group} has no budget in {semester} yet", hint="give --amount")
        budget = Budget(group_id=g.id, semester_id=sem.id, amount_micros=0, thresholds="50,80,100",
                        hold_pending=True, cancel_running=False, created_at=now, updated_at=now)
        s.add(budget)
    old = budget.amount_micros
    if amount is not None:
        budget.amount_micros = _money(amount, "--amount")
    if thresholds is not None:
        budget.thresholds = _thresholds(thresholds)
    if hold_pending is not None:
        budget.hold_pending = bool(hold_pending)
    if cancel_running is not None:
        budget.cancel_running = bool(cancel_running)
    if alert_command is not None:
        if not isinstance(alert_command, list) or not all(isinstance(a, str) for a in alert_command):
            raise SpecError("--alert-command: expected a command and its arguments")
        if alert_command and not alert_command[0].startswith("/"):
            raise SpecError("--alert-command: give the program's absolute path", hint="e.g. /usr/local/bin/notify")
        budget.alert_command = json.dumps(alert_command) if alert_command else None
    if alert_url is not None:
        if alert_url and not re.match(r"^https?://", alert_url):
            raise SpecError("--alert-url: use an http:// or https:// URL")
        budget.alert_url = alert_url or None
    budget.updated_at = now
    s.flush()
    store.add_event(
        s, "budget",
        f"budget of {group} in {semester}: {format_money(old)} -> {format_money(budget.amount_micros)}, "
        f"thresholds {budget.thresholds}, hold pending {budget.hold_pending}, cancel running "
        f"{budget.cancel_running} (by {caller.name})",
        now=now,
    )
    status = B.budget_status(s, g, sem, budget, pricebook.load(s, svc.settings), svc.settings, now)
    out = status.as_dict()
    out.update(thresholds=budget.thresholds, hold_pending=budget.hold_pending, cancel_running=budget.cancel_running,
               alert_command=json.loads(budget.alert_command) if budget.alert_command else None,
               alert_url=budget.alert_url)
    return out


def budget_list(s: Session, svc: Services, caller: Caller, now: datetime, *, semester: str | None = None,
                window_days: float = 7.0) -> dict[str, Any]:
    return reporting.budget_rows(s, caller, svc.settings, semester, now, window_days)


def report(s: Session, svc: Services, caller: Caller, now: datetime, *, semester: str | None = None,
           by: str = "group") -> dict[str, Any]:
    return reporting.report(s, caller, svc.settings, semester, by, now)


def burndown(s: Session, svc: Services, caller: Caller, now: datetime, *, semester: str | None = None) -> dict[str, Any]:
    return reporting.burndown(s, caller, svc.settings, semester, now)


def ledger_lines(s: Session, svc: Services, caller: Caller, now: datetime, *, semester: str | None = None,
                 job_id: int | None = None, group: str | None = None, limit: int = 10_000) -> list[dict[str, Any]]:
    return reporting.charge_lines(s, caller, semester_name=semester, job_id=job_id, group=group, limit=limit)
