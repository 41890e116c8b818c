"""The daemon: APScheduler wiring, signals, the single-writer lease, graceful stop.

One daemon acts on a database at a time: it holds a lease row that it renews
every few seconds. A second daemon finds the lease held and either waits for
it (``--wait``) or exits with a message that names the holder.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler

from broker import amount
from broker.api import ApiServer, caller_for_uid
from broker.config import MIGRATE_HINT, Settings
from broker.db.engine import check_private
from broker.errors import BrokerError
from broker.nodes.manager import NodeManager
from broker.ops import systemd
from broker.ops.listener import OpsListener
from broker.ops.reload import reload_settings
from broker.ops.stats import CountingBackend, DaemonStats
from broker.state import Services
from broker.web.app import Dashboard
from broker.wiring import build_services, check_hook_user, handlers, periodic_ticks, reconcile_tick

log = logging.getLogger(__name__)

LEASE_NAME = "daemon"


class LeaseHeld(BrokerError):
    exit_code = 8


class Daemon:
    def __init__(self, settings: Settings, services: Services | None = None) -> None:
        self.settings = settings
        self.services = services or build_services(settings)
        self.stats = DaemonStats()
        """Tick times, Slurm call errors, the lease: for /metrics and /readyz (broker/ops)."""
        if not isinstance(self.services.backend, CountingBackend):
            self.services.backend = CountingBackend(self.services.backend, self.stats)  # type: ignore[assignment]
        self.nodes = NodeManager(self.services)
        self.handlers = handlers(self.services, self.nodes)
        """The operations, one table for the socket and the dashboard."""
        self.holder = f"{socket.gethostname()}:{os.getpid()}"
        self.stopping = threading.Event()
        self.reload_asked = threading.Event()
        self.scheduler = BackgroundScheduler(timezone="UTC")
        self.server: ApiServer | None = None
        self.ops: OpsListener | None = None
        self.config_path: str | None = None
        """The settings file SIGHUP reads again (None: the default, or $GBROKER_CONFIG)."""
        self.overrides: dict[str, Any] = {}
        """The command line's settings, applied again over a reloaded file."""

    # -- lease -------------------------------------------------------------
    def acquire_lease(self, wait: bool) -> None:
        ttl = self.settings.lease_ttl_seconds
        while True:
            holder = self.services.try_lease(LEASE_NAME, self.holder, ttl)
            if holder is None:
                log.info("lease %r acquired by %s", LEASE_NAME, self.holder)
                self.stats.lease_ok(self.holder)
                return
            if holder_is_dead(holder) and self.services.take_over_lease(LEASE_NAME, holder, self.holder, ttl):
                log.warning("took the lease over from %s, a daemon on this host that is gone", holder)
                self.stats.lease_ok(self.holder)
                return
            if not wait:
                raise LeaseHeld(
                    f"another gbroker daemon ({holder}) is active on this database",
                    hint="stop it first, or start this one with --wait to take over when it stops",
                )
            log.info("lease held by %s; waiting", holder)
            if self.stopping.wait(min(ttl / 3, 5.0)):
                raise LeaseHeld("stopped while waiting for the lease")

    def _renew_lease(self) -> None:
        if self.services.try_lease(LEASE_NAME, self.holder, self.settings.lease_ttl_seconds) is not None:
            # Someone else took the database over: a second writer would corrupt the ledger.
            log.error("lost the daemon lease; stopping")
            self.stats.lease_gone()
            self.stop()
            return
        self.stats.lease_ok(self.holder)

    # -- life cycle --------------------------------------------------------
    def start(self, wait_for_lease: bool = False) -> None:
        check_private(self.settings.db_url)
        warning = check_hook_user(self.settings)
        if warning:
            log.warning("%s", warning)
        metrics = self.settings.metrics
        if metrics.enabled:
            # Bound first: a port in use stops the start before the lease is taken, and a daemon
            # waiting for the lease (--wait) answers /readyz with "not ready" meanwhile.
            web = Dashboard(self.services, self.handlers,
                            lambda uid: caller_for_uid(uid, self.settings.admin_group))
            if self.settings.web.trust_proxy_header:
                web.proxy_secret()  # a missing or unsafe secret file stops the start, with what to do
            self.ops = OpsListener(self.services, self.stats, metrics.host, metrics.port, web=web)
            self.ops.start()
        self.services.migrate()
        self.acquire_lease(wait_for_lease)
        tick = self.settings.tick_seconds
        self.scheduler.add_job(
            self.stats.timed("reconcile", reconcile_tick(self.services)),
            "interval",
            seconds=tick,
            id="reconcile",
            max_instances=1,
            coalesce=True,
            next_run_time=None,
        )
        for job_id, func, seconds in periodic_ticks(self.services, self.nodes):
            self.scheduler.add_job(
                self.stats.timed(job_id, func), "interval", seconds=seconds, id=job_id, max_instances=1,
                coalesce=True,
            )
        self.scheduler.add_job(
            self._renew_lease,
            "interval",
            seconds=max(1.0, self.settings.lease_ttl_seconds / 3),
            id="lease",
            max_instances=1,
            coalesce=True,
        )
        self.server = ApiServer(self.settings.socket, self.handlers, self.settings.admin_group)
        self.server.serve_in_thread()
        watchdog = systemd.watchdog_interval()
        if watchdog is not None:
            self.scheduler.add_job(self._watchdog, "interval", seconds=watchdog, id="watchdog", max_instances=1,
                                   coalesce=True)
        self.scheduler.start()
        # First tick at once, so a restarted daemon adopts what it finds without delay.
        self.scheduler.modify_job("reconcile", next_run_time=_now())
        log.info(
            "gbroker daemon up: socket %s, database %s, policy %s, tick %ss",
            self.settings.socket,
            _redact(self.settings.db_url),
            self.settings.policy,
            tick,
        )
        pools = self.settings.catalog().pools
        log.info("pools: %s", ", ".join(f"{p.name} ({p.capacity}, {p.partition})" for p in pools))
        if not self.settings.pools:
            log.info(MIGRATE_HINT)
        systemd.notify(f"READY=1\nMAINPID={os.getpid()}\nSTATUS=serving {self.settings.socket}")

    def _watchdog(self) -> None:
        """WATCHDOG=1 while the reconcile tick keeps finishing: a wedged scheduler gets the daemon restarted."""
        from broker.ops.health import max_tick_age

        age = self.stats.tick_age("reconcile")
        if age is None or age <= max_tick_age(self.services) * 2:
            systemd.notify("WATCHDOG=1")
        else:
            log.error("reconcile tick has not finished for %.0fs; withholding the systemd watchdog ping", age)

    def reload(self) -> None:
        """SIGHUP: the settings file again; what can change at run time changes (broker/ops/reload.py)."""
        from broker.config import load_settings

        systemd.notify(f"RELOADING=1\nMONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")
        def load() -> Settings:
            new = load_settings(self.config_path, overrides=self.overrides)
            warning = check_hook_user(new)  # as at start: a hook_user that is no user is refused
            if warning:
                log.warning("%s", warning)
            return new

        merged = reload_settings(self.settings, load)
        self.settings = merged
        self.services.settings = merged
        amount.show_in(merged.currency)
        systemd.notify("READY=1")

    def stop(self, *_: Any) -> None:
        if self.stopping.is_set():
            return
        self.stopping.set()

    def shutdown(self) -> None:
        log.info("stopping: waiting for the running tick to finish")
        systemd.notify("STOPPING=1")
        if self.ops is not None:
            self.ops.stop()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        if self.scheduler.running:
            self.scheduler.shutdown(wait=True)
        self.services.release_lease(LEASE_NAME, self.holder)
        log.info("stopped")

    def run_forever(self, wait_for_lease: bool = False) -> None:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        signal.signal(signal.SIGHUP, lambda *_: self.reload_asked.set())
        self.start(wait_for_lease)
        try:
            while not self.stopping.wait(0.5):
                if self.reload_asked.is_set():
                    self.reload_asked.clear()
                    self.reload()
        finally:
            self.shutdown()


def holder_is_dead(holder: str) -> bool:
    """True when `holder` ("host:pid") names a daemon on this host whose process is gone.

    After a crash the lease would otherwise block a restarted daemon for its
    whole TTL. A holder on another host is never presumed dead: its lease expires.
    """
    host, _, pid_text = holder.rpartition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    proc = f"/proc/{int(pid_text)}"
    try:
        with open(f"{proc}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        with open(f"{proc}/cmdline", "rb") as f:
            cmdline = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return True
    except (OSError, IndexError):
        return False
    if state == b"Z":
        return True  # exited, not yet reaped
    if not cmdline:
        return False  # between fork and exec: cannot tell, so not dead
    return b"broker" not in cmdline


def _now() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)


def _redact(url: str) -> str:
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url
