"""Notifications: the event log -> outbox rows, in one transaction with the cursor.

The domains already write every fact worth telling to the append-only event
log in the same transaction as the change itself (a job completing, a run
reclaimed, a move to on-demand, a budget threshold crossed). The notify tick
reads the events after its cursor, makes one outbox row per message and
target (a unique key per event and target, so a row is made once) and moves
the cursor, all in one transaction: a crash before the commit redoes the
batch, after it nothing is lost. "Deadline at risk" is not an event: the
tick looks at the active jobs with a deadline and makes it once per job.

Who is told is the settings' ``[[notify.subscriptions]]`` (per user, per
group, per event), plus, for budget alerts, the budget's own hook (its
``--alert-url`` and ``--alert-command``). ``broker/ops/outbox.py`` delivers.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from broker.db.ledger_models import Budget, BudgetAlert
from broker.db.models import Event, Job
from broker.db.ops_models import NotifyCursor, OutboxMessage
from broker.jobs.submit import stored_spec
from broker.money import budgets
from broker.amount import currency_prefix, format_money
from broker.opsconfig import NotifySettings
from broker.state import Services
from broker.states import ACTIVE

log = logging.getLogger(__name__)

BATCH = 500
CURSOR = "events"


def iso(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


def money_text(micros: int, currency: str) -> str:
    """``$1,234.50`` for USD (as the CLI writes it), else ``EUR 1,234.50``."""
    return format_money(micros, currency=currency_prefix(currency))


def classify(ev: Event) -> list[str]:
    """The notification events an event-log row stands for (most stand for none)."""
    data = json.loads(ev.data_json or "{}")
    if ev.kind == "state":
        return {"completed": ["job.completed"], "failed": ["job.failed"]}.get(data.get("to", ""), [])
    if ev.kind in ("reclaimed", "preempted"):
        out = ["job.reclaimed"]
        # Events stored before they carried the policy's action said it in their text only.
        if data.get("policy", "move_ondemand" if "policy: move_ondemand" in ev.message else "") == "move_ondemand":
            out.append("job.moved_to_ondemand")
        return out
    if ev.kind in ("fallback", "moved") and data.get("to_capacity") == "ondemand":
        return ["job.moved_to_ondemand"]
    if ev.kind == "fallback" and "to_capacity" not in data and "meet the deadline" in ev.message:
        return ["job.moved_to_ondemand"]  # stored before events carried it
    if ev.kind == "budget_alert":
        return ["budget.threshold"]
    return []


def job_payload(job: Job, event: str, message: str, at: datetime, currency: str) -> dict[str, Any]:
    """A job's message as stored in the outbox.

    ``text`` holds words gbroker did not write (the job's name, which its owner
    can change in Slurm, a reason quoting it, user and group names) as they are:
    each target's markup is applied once, at delivery (``broker.ops.markup``), so
    rows queued before a markup rule changed are sent by the rule of the day.
    """
    what = {
        "job.completed": "completed",
        "job.failed": "failed",
        "job.reclaimed": "lost its spot node (reclaimed)",
        "job.moved_to_ondemand": "moved to on-demand",
        "job.deadline_at_risk": "may miss its deadline",
    }[event]
    text = f"gbroker: job {job.id} ({job.name}, {job.owner_name}/{job.group_name}) {what}: {message}"
    return {
        "event": event, "text": text, "at": iso(at), "message": message, "currency": currency,
        "job": {"id": job.id, "key": job.key, "name": job.name, "user": job.owner_name, "group": job.group_name,
                "state": job.state.value, "partition": job.partition, "reason": job.reason,
                "deadline": iso(job.deadline) if job.deadline else None},
    }


def enqueue(s: Session, svc: Services, now: datetime) -> int:
    """Turn new events (and deadlines newly at risk) into outbox rows; returns how many rows were made."""
    cfg = svc.settings.notify
    cursor = s.get(NotifyCursor, CURSOR)
    if cursor is None:
        cursor = NotifyCursor(name=CURSOR, last_event_id=0)
        s.add(cursor)
    made = 0
    events = list(s.execute(select(Event).where(Event.id > cursor.last_event_id).order_by(Event.id)
                            .limit(BATCH)).scalars())
    for ev in events:
        for event in classify(ev):
            made += _for_event(s, svc, cfg, ev, event, now)
    if events:
        cursor.last_event_id = events[-1].id
    made += _deadlines(s, svc, cfg, now)
    return made


def _for_event(s: Session, svc: Services, cfg: NotifySettings, ev: Event, event: str, now: datetime) -> int:
    currency = svc.settings.currency
    if event == "budget.threshold":
        data = json.loads(ev.data_json or "{}")
        group = str(data.get("group", ""))
        payload, hooks = _budget(s, data, ev, currency)
        targets = [(sub.target, {"name": sub.target}) for sub in cfg.subscriptions
                   if sub.matches(event, None, group)]
        targets += hooks
    else:
        job = s.get(Job, ev.job_id) if ev.job_id is not None else None
        if job is None:
            return 0
        payload = job_payload(job, event, ev.message, ev.at, currency)
        targets = [(sub.target, {"name": sub.target}) for sub in cfg.subscriptions
                   if sub.matches(event, job.owner_name, job.group_name)]
    return _add(s, f"{ev.id}", event, ev.id, targets, payload, now)


def _budget(s: Session, data: dict[str, Any], ev: Event, currency: str) -> tuple[dict[str, Any],
                                                                                 list[tuple[str, dict[str, Any]]]]:
    group, semester, pct = str(data.get("group", "")), str(data.get("semester", "")), int(data.get("threshold_pct", 0))
    spent = amount = 0
    hooks: list[tuple[str, dict[str, Any]]] = []
    budget: Budget | None = None
    try:
        g = budgets.group_named(s, group)
        sem = budgets.semester_named(s, semester)
        budget = budgets.budget_of(s, g.id, sem.id)
    except Exception:  # the group or semester is gone: tell the subscribers, without the budget's hooks
        budget = None
    if budget is not None:
        fired = s.execute(select(BudgetAlert).where(BudgetAlert.budget_id == budget.id,
                                                    BudgetAlert.threshold_pct == pct)).scalars().first()
        if fired is not None:
            spent, amount = fired.spent_micros, fired.amount_micros
        hooks = _budget_hooks(budget)
    payload = {
        "event": "budget.threshold", "text": f"gbroker: {ev.message}", "at": iso(ev.at), "message": ev.message,
        "currency": currency, "group": group, "semester": semester, "threshold_pct": pct,
        "spent_micros": spent, "amount_micros": amount, "spent": money_text(spent, currency), "amount": money_text(amount, currency),
    }
    return payload, hooks


def _budget_hooks(budget: Budget) -> list[tuple[str, dict[str, Any]]]:
    """The budget's own alert hooks (set with `gbroker budget set --alert-url/--alert-command`)."""
    out: list[tuple[str, dict[str, Any]]] = []
    if budget.alert_url:
        out.append(("budget-url", {"kind": "webhook", "url": budget.alert_url}))
    if budget.alert_command:
        out.append(("budget-command", {"kind": "command", "argv": json.loads(budget.alert_command)}))
    return out


def _deadlines(s: Session, svc: Services, cfg: NotifySettings, now: datetime) -> int:
    """Active deadline jobs whose time left (time limit minus work saved) no longer fits before the deadline."""
    if not any("job.deadline_at_risk" in sub.events for sub in cfg.subscriptions):
        return 0
    made = 0
    for job in s.execute(select(Job).where(Job.state.in_(list(ACTIVE)), Job.deadline.is_not(None))).scalars():
        assert job.deadline is not None
        try:
            limit = stored_spec(job).time_limit_s
        except Exception:
            continue
        needed = max(0, limit - (job.done_s or 0))
        left = (job.deadline - now).total_seconds()
        if left >= needed:
            continue
        targets = [(sub.target, {"name": sub.target}) for sub in cfg.subscriptions
                   if sub.matches("job.deadline_at_risk", job.owner_name, job.group_name)]
        msg = (f"{int(left // 60)} min to its deadline {iso(job.deadline)}, up to {needed // 60} min of work left "
               f"({job.state.value}, {job.partition or 'not placed'})")
        made += _add(s, f"deadline:{job.id}", "job.deadline_at_risk", None, targets,
                     job_payload(job, "job.deadline_at_risk", msg, now, svc.settings.currency), now)
    return made


def _add(s: Session, key: str, event: str, event_id: int | None, targets: list[tuple[str, dict[str, Any]]],
         payload: dict[str, Any], now: datetime) -> int:
    made = 0
    for name, target in targets:
        dedupe = f"{key}:{name}"
        if s.execute(select(OutboxMessage.id).where(OutboxMessage.dedupe_key == dedupe)).first() is not None:
            continue
        s.add(OutboxMessage(dedupe_key=dedupe, event=event, event_id=event_id, target=name,
                            target_json=json.dumps(target, sort_keys=True), payload_json=json.dumps(payload),
                            status="pending", tries=0, next_at=now, created_at=now, last_error=""))
        made += 1
    if made:
        s.flush()
    return made
