"""Placement policies: pure functions of (job view, market view).

Import a policy by name with ``policies.from_name("gbroker")``; the list of
names is ``policies.names()``. ``omniscient`` is the simulator's lower bound
and needs a plan computed from a known trace.

May import: nothing of ``broker``. A policy reads only its arguments
(principle 1), which is what lets the daemon and the simulator share it.
"""

from policies.base import (  # noqa: F401
    Action,
    AttemptView,
    Capacity,
    Decision,
    JobView,
    MarketView,
    Placement,
    Policy,
    PoolChoice,
    PoolPlacement,
    PoolView,
    PREPAID,
    expected_spot_cost,
    from_name,
    names,
    register,
)
from policies import simple  # noqa: F401,E402  (each module registers itself)
from policies import ondemand  # noqa: F401,E402
from policies import greedy  # noqa: F401,E402
from policies import uniform_progress  # noqa: F401,E402
from policies import omniscient  # noqa: F401,E402
from policies import gepa  # noqa: F401,E402
from policies import gbroker_markov  # noqa: F401,E402
from policies import gbroker  # noqa: F401,E402

__all__ = [
    "Action", "AttemptView", "Capacity", "Decision", "JobView", "MarketView", "Placement", "Policy", "PoolPlacement",
    "PoolChoice", "PoolView", "PREPAID", "expected_spot_cost",
    "from_name", "names", "register",
]
