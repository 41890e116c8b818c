"""Budget alerts: a log line always, then the budget's hook (a command, a webhook URL, or both).

The hooks are delivered through the notification outbox (``broker/ops/``):
the ledger tick writes a ``budget_alert`` event in the transaction that
records the alert, the notify tick turns it into outbox rows for the
budget's hooks and the ``budget.threshold`` subscriptions, and delivers them
with retries and ``[notify] timeout_seconds``, so a webhook that is down gets
the alert when it is back and a daemon restart loses none. The command gets
the alert as JSON on stdin and as GBROKER_ALERT_* environment variables; it is
an argv list (no shell), and it runs as the configured ``hook_user``
(``nobody`` unless root's config file says otherwise), never as the daemon's
root (``broker/ops/outbox.py``). ``fire`` logs; it does not send.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Alert:
    group: str
    semester: str
    threshold_pct: int
    spent_micros: int
    amount_micros: int
    spent: str
    amount: str
    at: str
    message: str


def fire(alert: Alert, command: list[str] | None, url: str | None) -> None:
    """Log the alert. Its hooks (``command``, ``url``) are sent by the outbox from the ``budget_alert``
    event (``broker/ops/notify.py``), with retries; they are named here for the log only."""
    hooks = [h for h in (f"command {command[0]}" if command else "", f"webhook {url}" if url else "") if h]
    log.warning("budget alert: %s%s", alert.message, f" (notifying {', '.join(hooks)} through the outbox)"
                if hooks else "")
