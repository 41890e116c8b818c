"""Placement policies: pure functions of (job view, market view).

Import a policy by name with ``policies.from_name("gbroker")``; the list of
names is ``policies.names()``.
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
    from_name,
    names,
    register,
)
from policies import simple  # noqa: F401,E402  (registers itself)
