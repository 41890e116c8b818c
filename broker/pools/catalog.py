"""The pool catalog: every kind of capacity the lab can run a job on.

A pool is one Slurm partition of like nodes: its capacity class (``owned``,
``reserved``, ``spot``, ``ondemand``), its GPU type (Slurm's gres type) and
memory per GPU, GPUs per node, a relative speed, a zone label, how it bills,
and how the node manager treats its nodes. The settings file declares them::

    [pools.a100-spot-a]
    partition = "spot"
    capacity = "spot"
    gpu_type = "a100"
    gpu_mem_gb = 80
    gpus_per_node = 4
    zone = "eu-west-1a"
    price_per_gpu_hour = "1.10"   # used when the price book has no price for it
    billing = "second"            # "second", "minute" (minimum 60 s) or "hour": per started hour

A settings file from before pools (``[partitions] spot = ... ondemand = ...``)
still works: it is read as two pools, ``spot`` and ``ondemand``
(:func:`legacy_pools`). This module is the one place that maps a partition to
its pool. It imports only the standard library: the CLI loads it on every call.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from broker.errors import ConfigError

CLASSES = ("owned", "reserved", "spot", "ondemand")
"""Capacity classes, in the order placement considers them."""
PREPAID = frozenset({"owned", "reserved"})
"""Classes already paid for: their marginal cost is their internal rate (0 by default)."""

BILLING = {"second": (1, 0), "minute": (60, 60), "hour": (3600, 3600)}
"""Billing names -> (increment, minimum), seconds. "hour" is per started hour."""

POOL_KEYS = (
    "partition", "capacity", "gpu_type", "gpu_mem_gb", "gpus_per_node", "cpus_per_node", "mem_per_node_gb",
    "speed", "zone", "price_per_gpu_hour", "price_per_node_hour", "billing", "billing_increment_seconds",
    "billing_minimum_seconds", "stopped_price_per_hour", "stopped_bills", "idle_seconds", "warm_min",
    "power_down", "instance_type",
)
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")


@dataclass(frozen=True)
class Billing:
    """How a pool's provider charges for a node's time."""

    increment_s: int = 1
    """Time is charged in whole increments, rounded up: 1 per second, 3600 per started hour."""
    minimum_s: int = 0
    """A node up for less is charged this much."""
    stopped_price_per_hour: str | None = None
    """What keeps billing per node-hour after a node is stopped (disks, addresses); exact decimal."""
    stopped_bills: str = ""
    """What that is, in words (``"EBS volume and Elastic IP"``)."""

    def billed_s(self, used_s: int) -> int:
        """Seconds charged for a node up ``used_s`` seconds: 61 minutes per started hour is 7,200."""
        if used_s <= 0:
            return 0
        used = max(used_s, self.minimum_s)
        return -(-used // self.increment_s) * self.increment_s

    def paid_until_s(self, up_s: int) -> int:
        """Seconds after boot until which the node's time is already paid for."""
        return self.billed_s(max(up_s, 1))

    @property
    def per_second(self) -> bool:
        return self.increment_s == 1 and self.minimum_s == 0

    def describe(self) -> str:
        names = {v: k for k, v in BILLING.items()}
        name = names.get((self.increment_s, self.minimum_s))
        text = f"per {name}" if name else f"per {self.increment_s} s, minimum {self.minimum_s} s"
        if name == "hour":
            text = "per started hour"
        if self.stopped_price_per_hour:
            text += f"; stopped: {self.stopped_price_per_hour}/h ({self.stopped_bills or 'storage'})"
        return text


@dataclass(frozen=True)
class Pool:
    """One pool of like capacity: a Slurm partition and what gbroker knows of it."""

    name: str
    partition: str
    capacity: str
    """One of ``CLASSES``."""
    gpu_type: str | None = None
    """Slurm's gres type (``gpu:TYPE:N``); None: the partition's GPUs are untyped."""
    gpu_mem_gb: int | None = None
    """Memory per GPU; None: unknown (a job asking for memory never fits)."""
    gpus_per_node: int | None = None
    """None: up to ``max_gpus_per_node``."""
    cpus_per_node: int | None = None
    mem_per_node_gb: int | None = None
    speed: float = 1.0
    """Work per GPU-hour against the reference type (1.0)."""
    zone: str = ""
    price_per_gpu_hour: str | None = None
    """Exact decimal; the price when the price book has none for this pool (prepaid: the internal rate)."""
    price_per_node_hour: str | None = None
    """Exact decimal; a node's price when it is not GPUs x the GPU-hour price."""
    billing: Billing = Billing()
    idle_seconds: float | None = None
    """A node idle this long is released; None: ``node_idle_seconds``."""
    warm_min: int = 0
    power_down: bool = True
    """False: the node manager never releases this pool's nodes (the default for owned and reserved)."""
    instance_type: str | None = None

    @property
    def prepaid(self) -> bool:
        return self.capacity in PREPAID

    @property
    def spot(self) -> bool:
        return self.capacity == "spot"

    def describe_gpu(self) -> str:
        kind = self.gpu_type or "gpu"
        mem = f" {self.gpu_mem_gb} GB" if self.gpu_mem_gb else ""
        per = f" x{self.gpus_per_node}" if self.gpus_per_node else ""
        return f"{kind}{mem}{per}"


def legacy_pools(spot_partition: str, ondemand_partition: str) -> tuple[Pool, ...]:
    """The two pools a settings file from before the catalog means."""
    return (Pool("spot", spot_partition, "spot"), Pool("ondemand", ondemand_partition, "ondemand"))


def _money(value: Any, key: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, (float, bool, int)) and not isinstance(value, str):
        raise ValueError(f'write {key} as a string, e.g. "2.40" (money is exact)')
    from broker.amount import parse_money

    if parse_money(str(value)) < 0:
        raise ValueError(f"{key} must not be negative, got {value!r}")
    return str(value)


def _whole(value: Any, key: str, low: int = 0) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{key} must be a whole number >= {low}, not {value!r}")
    return value


def _billing(table: Mapping[str, Any]) -> Billing:
    name = table.get("billing", "second")
    if name not in BILLING:
        raise ValueError(f"billing must be one of {', '.join(BILLING)}, not {name!r} "
                         "(or set billing_increment_seconds and billing_minimum_seconds)")
    inc, minimum = BILLING[name]
    inc = _whole(table.get("billing_increment_seconds", inc), "billing_increment_seconds", 1) or inc
    minimum = _whole(table.get("billing_minimum_seconds", minimum), "billing_minimum_seconds") or 0
    stopped = _money(table.get("stopped_price_per_hour"), "stopped_price_per_hour")
    what = table.get("stopped_bills", "")
    if not isinstance(what, str):
        raise ValueError("stopped_bills must be text, e.g. \"EBS volume\"")
    if what and not stopped:
        raise ValueError("stopped_bills says what bills while stopped; give stopped_price_per_hour too")
    return Billing(inc, minimum, stopped, what)


def parse_pools(value: Any, source: str) -> tuple[Pool, ...]:
    """The ``[pools.NAME]`` tables; every key checked, nothing ignored."""
    if not isinstance(value, dict) or not value or not all(isinstance(v, dict) for v in value.values()):
        raise ConfigError(f"{source}: [pools] must hold one table per pool, e.g. [pools.a100-spot]",
                          hint="see docs/POOLS.md for a lab example")
    out: list[Pool] = []
    for name, table in value.items():
        where = f"{source}: [pools.{name}]"
        if not NAME_RE.fullmatch(str(name)):
            raise ConfigError(f"{where}: a pool name is letters, digits, '.', '_' or '-' (at most 40)")
        unknown = sorted(set(table) - set(POOL_KEYS))
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}", hint="known keys: " + ", ".join(POOL_KEYS))
        try:
            partition = table.get("partition", name)
            if not isinstance(partition, str) or not NAME_RE.fullmatch(partition):
                raise ValueError(f"partition must be a Slurm partition name, not {partition!r}")
            capacity = table.get("capacity")
            if capacity not in CLASSES:
                raise ValueError(f"capacity must be one of {', '.join(CLASSES)}, not {capacity!r}")
            gpu_type = table.get("gpu_type")
            if gpu_type is not None and (not isinstance(gpu_type, str) or not NAME_RE.fullmatch(gpu_type)):
                raise ValueError(f"gpu_type must be Slurm's gres type name (e.g. \"a100\"), not {gpu_type!r}")
            speed = table.get("speed", 1.0)
            if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not 0 < speed <= 100:
                raise ValueError("speed must be a number above 0 and at most 100 (work per GPU-hour against "
                                 f"the reference), not {speed!r}")
            idle = table.get("idle_seconds")
            if idle is not None and (isinstance(idle, bool) or not isinstance(idle, (int, float)) or idle < 0):
                raise ValueError("idle_seconds must be a number >= 0")
            power_down = table.get("power_down", capacity not in PREPAID)
            if not isinstance(power_down, bool):
                raise ValueError("power_down must be true or false")
            zone, itype = table.get("zone", ""), table.get("instance_type")
            if not isinstance(zone, str) or (itype is not None and not isinstance(itype, str)):
                raise ValueError("zone and instance_type are text")
            price = _money(table.get("price_per_gpu_hour"), "price_per_gpu_hour")
            if price is None and capacity in PREPAID:
                price = "0"  # already paid for: its marginal cost
            out.append(Pool(
                name=str(name), partition=partition, capacity=capacity, gpu_type=gpu_type,
                gpu_mem_gb=_whole(table.get("gpu_mem_gb"), "gpu_mem_gb", 1),
                gpus_per_node=_whole(table.get("gpus_per_node"), "gpus_per_node", 1),
                cpus_per_node=_whole(table.get("cpus_per_node"), "cpus_per_node", 1),
                mem_per_node_gb=_whole(table.get("mem_per_node_gb"), "mem_per_node_gb", 1),
                speed=float(speed), zone=zone, price_per_gpu_hour=price,
                price_per_node_hour=_money(table.get("price_per_node_hour"), "price_per_node_hour"),
                billing=_billing(table), idle_seconds=None if idle is None else float(idle),
                warm_min=_whole(table.get("warm_min", 0), "warm_min") or 0,
                power_down=power_down, instance_type=itype,
            ))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: {exc}", hint=f"fix [pools.{name}] in {source}") from None
    check_unique(out, source)
    return tuple(out)


def check_unique(pools: Iterable[Pool], source: str) -> None:
    """One pool per partition: the partition -> pool map must have one answer."""
    seen: dict[str, str] = {}
    for p in pools:
        if p.partition in seen:
            raise ConfigError(
                f"{source}: pools {seen[p.partition]!r} and {p.name!r} both name partition {p.partition!r}",
                hint="give each pool its own Slurm partition (a partition per GPU type is the usual layout)",
            )
        seen[p.partition] = p.name


@dataclass(frozen=True)
class Catalog:
    """The pools, and the one partition -> pool map."""

    pools: tuple[Pool, ...]

    def by_partition(self, partition: str) -> Pool | None:
        for p in self.pools:
            if p.partition == partition:
                return p
        return None

    def by_name(self, name: str) -> Pool | None:
        for p in self.pools:
            if p.name == name:
                return p
        return None

    def of_class(self, *classes: str) -> tuple[Pool, ...]:
        return tuple(p for p in self.pools if p.capacity in classes)

    @property
    def partitions(self) -> tuple[str, ...]:
        return tuple(p.partition for p in self.pools)

    def largest_gpus_per_node(self) -> int | None:
        """The most GPUs a node of any pool has; None when a pool does not say (then any count may fit)."""
        counts = [p.gpus_per_node for p in self.pools]
        return max(c for c in counts if c is not None) if counts and None not in counts else None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.pools)
