"""Capacity pools: what the lab can run a job on.

Owns the pool catalog (``catalog``: owned, reserved, spot and on-demand
pools, their GPU type, memory, speed, zone, price and billing rule; the one
partition -> pool map) and which pools can hold a job's GPU request and why
the others cannot (``fit``), and whether a pool's Slurm partition takes a job
of that length and size (``limits``: MaxTime, MaxNodes, MinNodes). Pure.

May import: the standard library and the base modules (broker.errors,
broker.amount, broker.durations). Nothing above the base layer: the CLI and the settings load it.
"""

from broker.pools.catalog import CLASSES, PREPAID, Billing, Catalog, Pool, legacy_pools, parse_pools
from broker.pools.fit import GpuRequest, fits, fitting, refusal
from broker.pools.limits import limits_hint, partition_refuses

__all__ = ["CLASSES", "PREPAID", "Billing", "Catalog", "GpuRequest", "Pool", "fits", "fitting", "legacy_pools",
           "limits_hint", "parse_pools", "partition_refuses", "refusal"]
