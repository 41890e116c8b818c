"""Building the daemon's state and naming its ticks: the one place that knows every domain.

``build_services`` turns settings into a ``Services`` (database, Slurm
backend, policy); ``ticks`` lists the periodic work the daemon schedules:
the reconcile tick (jobs), the ledger tick (money) and the node tick
(nodes). It sits above the domains, so the domains never import each other
to find their ticks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import policies
from broker import amount
from broker.config import Settings
from broker.db.engine import make_engine, session_factory
from broker.errors import ConfigError
from broker.caller import Handler
from broker.jobs.handlers import handlers as job_handlers
from broker.jobs.reconcile import reconcile
from broker.money.handlers import handlers as money_handlers
from broker.money import ledger
from broker.nodes import manager
from broker.nodes.handlers import handlers as node_handlers
from broker.nodes.manager import NodeManager
from broker.ops import outbox
from broker.slurm import make_backend
from broker.slurm.runner import Runner
from broker.state import Services
from broker.web.auth import handlers as token_handlers

Tick = tuple[str, Callable[[], object], float]
"""(scheduler id, function, interval seconds)."""


def build_services(settings: Settings, **kwargs: Any) -> Services:
    amount.show_in(settings.currency)
    engine = make_engine(settings.db_url)
    sessions = session_factory(engine)
    backend = kwargs.pop("backend", None) or make_backend(
        settings.slurm_backend,
        runner=Runner(default_timeout_s=settings.slurm_timeout_seconds, bin_dir=settings.slurm_bin_dir),
        submit_with=settings.slurm_submit,
    )
    policy = kwargs.pop("policy", None) or make_policy(settings)
    return Services(settings=settings, sessions=sessions, reads=session_factory(engine, readonly=True),
                    backend=backend, policy=policy, **kwargs)


def check_hook_user(settings: Settings) -> str | None:
    """``hook_user`` (who budget alert commands run as) names a user of this machine: a ConfigError
    now, not a failed alert later. The default, ``nobody``, missing (a minimal image) is only a warning,
    returned: a lab without alert commands never needs it."""
    import pwd

    try:
        pwd.getpwnam(settings.hook_user)
    except KeyError:
        if settings.hook_user == Settings.hook_user:
            return (f"hook_user {settings.hook_user!r} (the default) is not a user of this machine: "
                    "budget alert commands cannot run until it is, or hook_user names one")
        raise ConfigError(f"hook_user = {settings.hook_user!r} is not a user of this machine",
                          hint='budget alert commands run as it: name one that exists (default "nobody")') from None
    return None


def make_policy(settings: Settings) -> policies.Policy:
    """The placement policy ``policy`` names; an unknown name is a configuration error."""
    if settings.policy not in policies.names():
        raise ConfigError(f"unknown policy {settings.policy!r}",
                          hint=f"set policy to one of: {', '.join(policies.names())}")
    if settings.policy == "simple":
        return policies.from_name("simple", max_spot_reclaims=settings.max_spot_reclaims)
    return policies.from_name(settings.policy)


def reconcile_tick(svc: Services) -> Callable[[], None]:
    """The reconcile tick, as the scheduler calls it."""
    return lambda: reconcile(svc)


def periodic_ticks(svc: Services, nodes: NodeManager) -> list[Tick]:
    """The ticks beside reconcile: the ledger's, the nodes' and the notification outbox's."""
    return [*ledger.ticks(svc), *manager.ticks(nodes), *outbox.ticks(svc)]


def handlers(svc: Services, nodes: NodeManager) -> dict[str, Handler]:
    """Every socket operation: jobs', money's, nodes' and the dashboard's sign-in tokens."""
    return {**job_handlers(svc), **money_handlers(svc), **node_handlers(svc, nodes), **token_handlers(svc)}
