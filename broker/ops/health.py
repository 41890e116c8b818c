"""/healthz and /readyz: is the process up; is it doing its work.

Ready means all three: this daemon holds the lease (renewed within its TTL),
the reconcile tick finished recently (``[metrics] ready_tick_age_seconds``,
by default three ticks and at least 30 s), and the Slurm controller answered
the last tick. Each failed check says why, so a probe's log tells the admin
what to look at.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.ops.stats import DaemonStats
from broker.state import Services

RECONCILE = "reconcile"


@dataclass(frozen=True)
class Readiness:
    ready: bool
    checks: dict[str, str]
    """check name -> "ok" or why not."""

    def as_dict(self) -> dict[str, object]:
        return {"ready": self.ready, "checks": self.checks}


def max_tick_age(svc: Services) -> float:
    configured = svc.settings.metrics.ready_tick_age_seconds
    return configured if configured > 0 else max(30.0, 3 * svc.settings.tick_seconds)


def readiness(svc: Services, stats: DaemonStats) -> Readiness:
    checks: dict[str, str] = {}
    lease_age = stats.lease_age()
    ttl = svc.settings.lease_ttl_seconds
    if lease_age is None:
        checks["lease"] = "this daemon does not hold the lease"
    elif lease_age > ttl:
        checks["lease"] = f"lease last renewed {lease_age:.0f}s ago (TTL {ttl:.0f}s)"
    else:
        checks["lease"] = "ok"
    age = stats.tick_age(RECONCILE)
    limit = max_tick_age(svc)
    if age is None:
        checks["tick"] = "no reconcile tick has finished yet"
    elif age > limit:
        checks["tick"] = f"last reconcile tick finished {age:.0f}s ago (limit {limit:.0f}s)"
    else:
        checks["tick"] = "ok"
    down = svc.slurm_down_since
    checks["slurm"] = "ok" if down is None else f"Slurm controller unreachable since {down:%Y-%m-%dT%H:%M:%SZ}"
    return Readiness(all(v == "ok" for v in checks.values()), checks)
