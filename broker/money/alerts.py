"""Budget alerts: a log line always, then the budget's hook (a command, a webhook URL, or both).

The hooks are delivered through the notification outbox (``broker/ops/``):
the ledger tick writes a ``budget_alert`` event in the transaction that
records the alert, the notify tick turns it into outbox rows for the
budget's hooks and the ``budget.threshold`` subscriptions, and delivers them
with retries, so a webhook that is down gets the alert when it is back and
a daemon restart loses none. ``fire`` logs; it no longer sends.

``run_command`` and ``post_webhook`` stay for callers that send at once. The
command gets the alert as JSON on stdin and as GBROKER_ALERT_* environment
variables; it is an argv list (no shell), and it runs as the configured
``hook_user`` (``nobody`` unless root's config file says otherwise), never as
the daemon's root.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass

from broker import proc
from broker.errors import BrokerError

log = logging.getLogger(__name__)

HOOK_TIMEOUT_SECONDS = 20.0


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

    def env(self) -> dict[str, str]:
        return {
            "GBROKER_ALERT_GROUP": self.group,
            "GBROKER_ALERT_SEMESTER": self.semester,
            "GBROKER_ALERT_THRESHOLD": str(self.threshold_pct),
            "GBROKER_ALERT_SPENT": self.spent,
            "GBROKER_ALERT_AMOUNT": self.amount,
            "GBROKER_ALERT_MESSAGE": self.message,
        }


def run_command(argv: list[str], alert: Alert, run_as: str) -> None:
    """Run an alert command as ``run_as`` (the settings' hook_user, ``nobody`` by default).

    Admins set these commands over the socket; being a gbroker admin is
    permission to manage money, not to run programs as root.
    """
    env = {"PATH": proc.SAFE_PATH, "LANG": "C.UTF-8", **alert.env()}
    try:
        who = proc.identity(run_as)
        result = proc.run(argv, env=env, timeout_s=HOOK_TIMEOUT_SECONDS, user=who,
                          input=json.dumps(asdict(alert)).encode(), max_output=64 * 1024)
    except BrokerError as exc:
        log.error("budget alert command %s could not run as %s: %s", argv, run_as, exc.message)
        return
    if result.timed_out:
        log.error("budget alert command %s timed out after %ss", argv, HOOK_TIMEOUT_SECONDS)
    elif result.returncode != 0:
        log.error("budget alert command %s exited %s: %s", argv, result.returncode, result.err.strip()[:500])


def post_webhook(url: str, alert: Alert) -> None:
    req = urllib.request.Request(
        url, data=json.dumps(asdict(alert)).encode(), method="POST",
        headers={"Content-Type": "application/json", "User-Agent": "gbroker"},
    )
    try:
        with urllib.request.urlopen(req, timeout=HOOK_TIMEOUT_SECONDS) as resp:
            resp.read(1024)
    except OSError as exc:
        log.error("budget alert webhook %s failed: %s", url, exc)


def fire(alert: Alert, command: list[str] | None, url: str | None, run_as: str,
         spawn: Callable[[Callable[[], None]], None] | None = None) -> None:
    """Log the alert. Its hooks (``command``, ``url``) are sent by the outbox from the ``budget_alert``
    event (``broker/ops/notify.py``), with retries; they are named here for the log only."""
    hooks = [h for h in (f"command {command[0]}" if command else "", f"webhook {url}" if url else "") if h]
    log.warning("budget alert: %s%s", alert.message, f" (notifying {', '.join(hooks)} through the outbox)"
                if hooks else "")


def _in_thread(fn: Callable[[], None]) -> None:
    threading.Thread(target=fn, name="gbroker-alert", daemon=True).start()
