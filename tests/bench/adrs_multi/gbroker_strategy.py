"""A gbroker policy as a strategy of the ADRS multi-region simulator.

``problems/cant_be_late_multi`` of UCB-ADRS/ADRS-Leaderboard scores
multi-region policies in its own simulator (``sky_spot``). This file is a
``MultiRegionStrategy`` that asks one of our policies (``gbroker`` unless
``GBROKER_ADRS_POLICY`` names another, with ``name@key=value`` as the
benchmarks take it) through ``Policy.place_pools``, with the same market views
our simulator builds: each region's availability up to the current tick, read
off the region's trace by ``SpotFeed`` (which never looks past the tick it is
asked about). ``bench_adrs_multi.py`` runs it; nothing else imports it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from sky_spot.strategies.multi_strategy import MultiRegionStrategy  # noqa: E402
from sky_spot.utils import ClusterType  # noqa: E402

from broker.sim.feed import SpotFeed  # noqa: E402
from broker.sim.single import policy_of  # noqa: E402
from broker.sim.trace import Trace  # noqa: E402
from policies.base import Capacity, JobView  # noqa: E402

_TO_THEIRS = {Capacity.SPOT: ClusterType.SPOT, Capacity.ONDEMAND: ClusterType.ON_DEMAND,
              Capacity.NONE: ClusterType.NONE}


class GBrokerAdrsStrategy(MultiRegionStrategy):
    NAME = "gbroker_place_pools"

    def __init__(self, args):  # type: ignore[no-untyped-def]
        super().__init__(args)
        self.policy = policy_of(os.environ.get("GBROKER_ADRS_POLICY", "gbroker"))

    def reset(self, env, task):  # type: ignore[no-untyped-def]
        super().reset(env, task)
        self.feeds = []
        for sub in env.envs:
            tr = sub.trace
            counts = tuple(0 if tr[i] else 1 for i in range(len(tr)))  # their 1 = preempted
            self.feeds.append(SpotFeed(Trace("region", int(tr.gap_seconds), counts), 1, len(counts)))
        self.reclaims = 0
        self.pool: int | None = None
        self.current = Capacity.NONE

    def _step(self, last_cluster_type, has_spot):  # type: ignore[no-untyped-def]
        env = self.env
        # What ran last tick (the simulator's safety checks may have overridden
        # our answer), less a reclaim at this tick.
        if last_cluster_type == ClusterType.SPOT and not has_spot:
            self.reclaims += 1
            self.current = Capacity.NONE
        elif last_cluster_type == ClusterType.SPOT:
            self.current, self.pool = Capacity.SPOT, env.get_current_region()
        elif last_cluster_type == ClusterType.ON_DEMAND:
            self.current = Capacity.ONDEMAND
        else:
            self.current = Capacity.NONE
        i = env.tick
        od = round(3.06 * 1_000_000)
        markets = []
        for k, feed in enumerate(self.feeds):
            price = env.envs[k].get_constant_cost_map()[ClusterType.SPOT]
            markets.append(feed.market(i, round(price * 1_000_000), od))
        view = JobView(kind="other", nodes=1, gpus_per_node=1, interruptible=True, checkpointable=True,
                       work_s=int(self.task_duration), done_s=int(sum(self.task_done_time)),
                       elapsed_s=int(env.elapsed_seconds), deadline_s=int(self.deadline),
                       changeover_s=int(self.restart_overhead), current=self.current,
                       reclaims=self.reclaims, pool=self.pool)
        placement = self.policy.place_pools(view, markets)
        cap = placement.capacity
        if cap is Capacity.SPOT:
            if placement.pool is None or not markets[placement.pool].spot_available:
                cap = Capacity.NONE
            else:
                env.switch_region(placement.pool)
        return _TO_THEIRS[cap]

    @classmethod
    def _from_args(cls, parser):  # type: ignore[no-untyped-def]
        args, _ = parser.parse_known_args()
        return cls(args)
