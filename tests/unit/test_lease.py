"""The daemon's single-writer lease, on SQLite and on a real PostgreSQL server."""

import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta

from broker.daemon import holder_is_dead
from broker.db import store

T0 = datetime(2026, 9, 1, tzinfo=UTC)


def test_take_over_only_from_the_named_dead_holder(session):
    assert store.acquire_lease(session, "daemon", "h:1", 60, T0)
    assert not store.acquire_lease(session, "daemon", "h:2", 60, T0 + timedelta(seconds=5))
    # A wrong idea of who holds it changes nothing.
    assert not store.take_over_lease(session, "daemon", "h:999", "h:2", 60, T0)
    assert store.lease_holder(session, "daemon", T0) == "h:1"
    assert store.take_over_lease(session, "daemon", "h:1", "h:2", 60, T0)
    assert store.lease_holder(session, "daemon", T0) == "h:2"
    # The old holder cannot renew any more, and cannot take it back by the same route twice.
    assert not store.renew_lease(session, "daemon", "h:1", 60, T0)
    assert not store.take_over_lease(session, "daemon", "h:1", "h:3", 60, T0)


def test_holder_is_dead():
    host = socket.gethostname()
    live = subprocess.Popen(["/bin/sh", "-c", "sleep 30", "gbroker-daemon"])
    try:
        assert not holder_is_dead(f"{host}:{live.pid}")
    finally:
        live.kill()
        live.wait()
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert holder_is_dead(f"{host}:{p.pid}")
    assert not holder_is_dead(f"another-host-{host}:{p.pid}")
    assert not holder_is_dead("garbage")
