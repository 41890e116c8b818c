"""systemd: ``sd_notify`` (READY, WATCHDOG, STOPPING, RELOADING) and journald's priority prefixes.

No library: the notify protocol is one datagram on the UNIX socket named by
``$NOTIFY_SOCKET`` (a leading ``@`` is Linux's abstract namespace). Without
that variable every call does nothing, so the daemon runs the same outside
systemd. Under systemd (``$JOURNAL_STREAM`` set) each log line starts with
``<N>``, the syslog priority, so ``journalctl -p err`` finds the errors.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger(__name__)

PRIORITY = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6, logging.DEBUG: 7}


def notify(state: str, env: Mapping[str, str] | None = None) -> bool:
    """Send ``state`` (e.g. "READY=1") to systemd; False when not under systemd or the send failed."""
    path = (os.environ if env is None else env).get("NOTIFY_SOCKET", "")
    if not path:
        return False
    if path.startswith("@"):
        path = "\0" + path[1:]
    elif not path.startswith("/"):
        log.warning("NOTIFY_SOCKET=%r is neither a path nor an abstract name; not notifying", path)
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(path)
            s.sendall(state.encode())
        return True
    except OSError as exc:
        log.warning("sd_notify %s failed: %s", state.split("=")[0], exc)
        return False


def watchdog_interval(env: Mapping[str, str] | None = None) -> float | None:
    """Seconds between WATCHDOG=1 pings (half of ``WatchdogSec``), or None when no watchdog is asked for."""
    env = os.environ if env is None else env
    usec = env.get("WATCHDOG_USEC", "")
    pid = env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) <= 0:
        return None
    if pid and pid != str(os.getpid()):
        return None
    return int(usec) / 1e6 / 2


def under_journald(env: Mapping[str, str] | None = None) -> bool:
    return bool((os.environ if env is None else env).get("JOURNAL_STREAM"))


class JournalFormatter(logging.Formatter):
    """``<3>broker.jobs.reconcile: message``: journald reads the prefix as the priority (and adds the time)."""

    def __init__(self) -> None:
        super().__init__("%(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        prio = PRIORITY.get(record.levelno, 3 if record.levelno > logging.WARNING else 6)
        text = super().format(record)
        # Every line of a multi-line record (a traceback) carries the priority.
        return "\n".join(f"<{prio}>{line}" for line in text.splitlines() or [""])


def log_handler(env: Mapping[str, str] | None = None) -> logging.Handler:
    """A stderr handler: journald's format under systemd, a plain time-stamped one otherwise."""
    handler = logging.StreamHandler()
    if under_journald(env):
        handler.setFormatter(JournalFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    return handler
