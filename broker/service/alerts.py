"""Budget alerts: a log line always, then the budget's hook (a command, a webhook URL, or both).

Hooks run in a background thread with a timeout, so a slow webhook never
delays the ledger tick. The command gets the alert as JSON on stdin and as
GBROKER_ALERT_* environment variables; it is an argv list (no shell).
"""

from __future__ import annotations

import json
import logging
import subprocess
import threading
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass

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


def run_command(argv: list[str], alert: Alert) -> None:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", **alert.env()}
    try:
        proc = subprocess.run(
            argv, input=json.dumps(asdict(alert)), text=True, env=env,
            capture_output=True, timeout=HOOK_TIMEOUT_SECONDS, check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.error("budget alert command %s failed: %s", argv, exc)
        return
    if proc.returncode != 0:
        log.error("budget alert command %s exited %s: %s", argv, proc.returncode, proc.stderr.strip()[:500])


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


def fire(alert: Alert, command: list[str] | None, url: str | None,
         spawn: Callable[[Callable[[], None]], None] | None = None) -> None:
    """Log the alert and start its hooks (in a thread unless ``spawn`` says otherwise)."""
    log.warning("budget alert: %s", alert.message)
    start = spawn or _in_thread
    if command:
        start(lambda: run_command(command, alert))
    if url:
        start(lambda: post_webhook(url, alert))


def _in_thread(fn: Callable[[], None]) -> None:
    threading.Thread(target=fn, name="gbroker-alert", daemon=True).start()
