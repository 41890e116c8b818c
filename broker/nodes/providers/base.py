"""The node provider contract: the cloud side behind Slurm's power saving.

Slurm stays the source of truth for node *state*; a provider only makes the
instance behind a node exist or not. Slurm calls ResumeProgram/SuspendProgram
with a hostlist, those call ``gbroker node resume|suspend HOSTLIST``, and that
hands the node names to the provider configured for the partition.

    resume(requests)   -> [Instance]  make an instance exist for each node.
                                      Idempotent: a node whose instance is
                                      already pending/running gets that instance
                                      back and nothing new boots (Slurm may call
                                      resume twice for one power-up).
    suspend(names)     -> None        terminate every instance of those nodes.
                                      Idempotent: nodes without instances are fine.
    terminate(ids)     -> None        terminate exactly these instances (the
                                      orphan sweep; never another cluster's).
    instances()        -> [Instance]  every instance this cluster owns, found by
                                      tag, in any state (dead ones included).
    interruptions()    -> [node name] nodes whose current spot instance got a
                                      reclaim notice or was reclaimed.

The orphan sweep's decision is the pure function :func:`sweep_plan`; the
daemon applies it (terminate through the provider, mark down through Slurm).
"""

from __future__ import annotations

import importlib
import inspect
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any

from broker.errors import BrokerError
from policies.base import Capacity

CLUSTER_TAG = "gbroker:cluster"
"""Tag naming the gbroker cluster that owns an instance; the only thing that makes it ours."""
NODE_TAG = "gbroker:node"
"""Tag naming the Slurm node an instance backs."""
PARTITION_TAG = "gbroker:partition"
CAPACITY_TAG = "gbroker:capacity"

NODE_CAPACITIES: frozenset[Capacity] = frozenset({Capacity.SPOT, Capacity.ONDEMAND})


# --------------------------------------------------------------------------- errors


class ProviderError(BrokerError):
    """The cloud (or a site's provider script) refused or failed a request."""

    exit_code = 8
    code: str = ""
    """The cloud's own error code, when it gave one (e.g. EC2's InsufficientInstanceCapacity)."""


class ProviderConfigError(ProviderError):
    """A provider name or setting is wrong; nothing was launched or terminated."""

    exit_code = 2


class ProviderCredentialsError(ProviderError):
    """The provider has no usable credentials, or they lack a permission."""


class ProviderUnreachable(ProviderError):
    """The provider's endpoint did not answer. Instance state is unknown, not gone."""


class CapacityUnavailable(ProviderError):
    """The cloud has no capacity (or quota) for this instance type right now."""


class ProviderCommandError(ProviderError):
    """A site provider command failed; carries argv, exit code and stderr."""

    def __init__(
        self,
        message: str,
        *,
        argv: Sequence[str],
        returncode: int | None,
        stderr: str = "",
        hint: str | None = None,
    ) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
        super().__init__(message, hint=hint)


class ResumeIncomplete(ProviderError):
    """Some nodes got instances, others did not.

    ``instances`` holds what was launched or found; ``failures`` maps each
    node that got nothing to the error that explains why. The caller should
    mark the failed nodes down in Slurm so jobs move elsewhere.
    """

    def __init__(self, instances: list[Instance], failures: dict[str, ProviderError]) -> None:
        self.instances = instances
        self.failures = failures
        lines = [f"{name}: {err.message}" for name, err in sorted(failures.items())]
        hints = sorted({err.hint for err in failures.values() if err.hint})
        super().__init__(
            f"{len(failures)} node(s) got no instance:\n  " + "\n  ".join(lines),
            hint="; ".join(hints) or "mark these nodes down in Slurm; the next resume retries them",
        )


# --------------------------------------------------------------------------- values


class InstanceState(str, Enum):
    """Lifecycle of one cloud instance (EC2's names; other providers map onto them)."""

    PENDING = "pending"
    """Launched, booting. Counts as alive: resume must not launch another."""
    RUNNING = "running"
    STOPPING = "stopping"
    """On its way to stopped: not usable, still ours to clean up."""
    STOPPED = "stopped"
    """Not running but still exists (disks cost money): the sweep terminates it."""
    SHUTTING_DOWN = "shutting-down"
    """Being terminated: gone for every purpose but reporting."""
    TERMINATED = "terminated"
    UNKNOWN = "unknown"
    """A state string we do not know. Treated as not alive and not dead, so the
    sweep may terminate it but resume will not count on it."""

    @classmethod
    def parse(cls, text: str) -> InstanceState:
        try:
            return cls(text.strip().lower().replace("_", "-"))
        except ValueError:
            return cls.UNKNOWN


ALIVE: frozenset[InstanceState] = frozenset({InstanceState.PENDING, InstanceState.RUNNING})
DEAD: frozenset[InstanceState] = frozenset({InstanceState.SHUTTING_DOWN, InstanceState.TERMINATED})


def parse_capacity(value: str | Capacity) -> Capacity:
    """'spot' / 'ondemand' (also 'on-demand', 'on_demand') -> Capacity; anything else is an error."""
    text = value.value if isinstance(value, Capacity) else str(value).strip().lower()
    text = text.replace("-", "").replace("_", "")
    try:
        cap = Capacity(text)
    except ValueError:
        cap = Capacity.NONE
    if cap not in NODE_CAPACITIES:
        raise ProviderConfigError(
            f"capacity {value!r} is not a node capacity",
            hint="use 'spot' or 'ondemand'",
        )
    return cap


@dataclass(frozen=True)
class NodeRequest:
    """One node Slurm wants powered up."""

    name: str
    partition: str
    capacity: Capacity
    instance_type: str | None = None
    """None: the provider's per-partition default."""
    generation: str | None = None
    """Identifies this power-up of the node. Two calls for the same power-up must
    carry the same value (the provider derives its idempotency token from it);
    a later power-up must carry a new one. None: the provider derives one."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "capacity", parse_capacity(self.capacity))


@dataclass(frozen=True)
class Instance:
    """One cloud instance owned by this cluster."""

    instance_id: str
    node_name: str
    """The node tag; "" when the tag is missing (such an instance backs no node)."""
    capacity: Capacity
    state: InstanceState
    launched_at: datetime
    """Timezone-aware UTC."""
    private_ip: str | None = None
    partition: str = ""
    instance_type: str = ""
    interrupted: bool = False
    """The cloud gave notice of, or carried out, a spot reclaim of this instance."""

    @property
    def alive(self) -> bool:
        return self.state in ALIVE

    @property
    def dead(self) -> bool:
        return self.state in DEAD


def pick_current(candidates: Iterable[Instance]) -> Instance | None:
    """The one alive instance that backs a node, when several exist.

    Running beats pending, then the earliest launch, then the smallest id, so
    every caller (two concurrent resumes, the sweep) picks the same one.
    """
    alive = [i for i in candidates if i.alive]
    if not alive:
        return None
    return min(
        alive,
        key=lambda i: (i.state is not InstanceState.RUNNING, i.launched_at, i.instance_id),
    )


# --------------------------------------------------------------------------- contract


class Provider(ABC):
    """Makes instances exist or not for Slurm nodes. See the module docstring."""

    name: str = ""
    """Registry name (``from_name``)."""

    @abstractmethod
    def resume(self, nodes: list[NodeRequest]) -> list[Instance]:
        """An alive instance for each node, in request order; boots only what is missing."""

    @abstractmethod
    def suspend(self, names: list[str]) -> None:
        """Terminate every instance of these nodes. Idempotent."""

    @abstractmethod
    def instances(self) -> list[Instance]:
        """Every instance this cluster owns (by tag), in any state."""

    def interruptions(self) -> list[str]:
        """Nodes whose current instance was reclaimed or got notice; sorted, may be empty."""
        return interrupted_nodes(self.instances())

    def terminate(self, instance_ids: list[str]) -> None:
        """Terminate exactly these instances (the orphan sweep).

        The default maps ids to nodes and suspends those nodes, which is only
        exact when no other live instance backs the same node; providers that
        can address instances directly override this.
        """
        if not instance_ids:
            return
        wanted = set(instance_ids)
        mine = self.instances()
        by_id = {i.instance_id: i for i in mine}
        unknown = sorted(wanted - by_id.keys())
        if unknown:
            raise ProviderError(
                f"refusing to terminate instance(s) this cluster does not own: {', '.join(unknown)}",
                hint="only instances listed by instances() can be terminated",
            )
        names = sorted({by_id[i].node_name for i in wanted})
        shared = sorted(
            i.instance_id for i in mine
            if i.node_name in names and i.instance_id not in wanted and not i.dead
        )
        if shared or "" in names:
            raise ProviderError(
                f"{self.name or type(self).__name__} cannot terminate single instances "
                f"(node(s) {', '.join(n or '<untagged>' for n in names)} have other live instances: "
                f"{', '.join(shared) or 'none'})",
                hint="configure a terminate command for this provider",
            )
        self.suspend(names)


def interrupted_nodes(instances: Iterable[Instance]) -> list[str]:
    """Nodes whose current instance is marked interrupted.

    A node with an alive instance is judged by that one alone (pick_current),
    so a node reclaimed earlier and resumed since is not reported again just
    because the old instance is still listed. A node with no alive instance
    is judged by its most recently launched ones (launch times tie at
    one-second resolution, so any of the newest counts).
    """
    by_node: dict[str, list[Instance]] = {}
    for inst in instances:
        if inst.node_name:
            by_node.setdefault(inst.node_name, []).append(inst)
    out = []
    for name, items in by_node.items():
        current = pick_current(items)
        if current is not None:
            hit = current.interrupted
        else:
            newest = max(i.launched_at for i in items)
            hit = any(i.interrupted for i in items if i.launched_at == newest)
        if hit:
            out.append(name)
    return sorted(out)


# --------------------------------------------------------------------------- sweep


@dataclass(frozen=True)
class SweepPlan:
    """What the orphan sweep should do; the daemon acts on it."""

    terminate: list[Instance] = field(default_factory=list)
    """Instances of ours that back no up node (or duplicate one), older than the grace."""
    mark_down: list[str] = field(default_factory=list)
    """Nodes Slurm thinks are up that have no alive instance."""
    reasons: dict[str, str] = field(default_factory=dict)
    """instance id -> why it is in ``terminate`` (for the log)."""

    @property
    def empty(self) -> bool:
        return not self.terminate and not self.mark_down


def sweep_plan(
    instances: Iterable[Instance],
    slurm_up_nodes: Iterable[str],
    now: datetime,
    grace_s: int,
) -> SweepPlan:
    """Decide the orphan sweep. Pure: reads nothing but its arguments.

    ``instances`` are this cluster's (by tag); ``slurm_up_nodes`` are the nodes
    Slurm holds powered up (not powering up, not powered down). ``grace_s``
    protects instances still booting; make it longer than Slurm's ResumeTimeout.

    - terminate: every instance that is not already dead, launched at least
      ``grace_s`` ago, and either backs no up node or is an extra instance of an
      up node (the node keeps :func:`pick_current`).
    - mark_down: up nodes with no alive instance (stopped or gone underneath Slurm).
    """
    up = set(slurm_up_nodes)
    items = list(instances)
    by_node: dict[str, list[Instance]] = {}
    for inst in items:
        by_node.setdefault(inst.node_name, []).append(inst)

    keep: set[str] = set()
    for node in up:
        current = pick_current(by_node.get(node, []))
        if current is not None:
            keep.add(current.instance_id)

    terminate: list[Instance] = []
    reasons: dict[str, str] = {}
    for inst in sorted(items, key=lambda i: (i.node_name, i.launched_at, i.instance_id)):
        if inst.dead or inst.instance_id in keep:
            continue
        if (now - inst.launched_at).total_seconds() < grace_s:
            continue
        terminate.append(inst)
        if not inst.node_name:
            reasons[inst.instance_id] = "tagged for this cluster but names no node"
        elif inst.node_name in up:
            reasons[inst.instance_id] = f"extra instance for {inst.node_name}"
        else:
            reasons[inst.instance_id] = f"node {inst.node_name} is not up in Slurm"

    mark_down = sorted(n for n in up if pick_current(by_node.get(n, [])) is None)
    return SweepPlan(terminate=terminate, mark_down=mark_down, reasons=reasons)


# --------------------------------------------------------------------------- registry

_REGISTRY: dict[str, str] = {
    "aws": "broker.nodes.providers.aws:AwsProvider",
    "command": "broker.nodes.providers.command:CommandProvider",
    "local": "broker.nodes.providers.local:LocalProvider",
}
"""Name -> "module:Class". Imported lazily so choosing ``command`` never imports boto3."""


def provider_names() -> list[str]:
    return sorted(_REGISTRY)


def provider_class(name: str) -> type[Provider]:
    """The class registered under ``name``; the error lists the valid names."""
    target = _REGISTRY.get(name.strip().lower()) if isinstance(name, str) else None
    if target is None:
        raise ProviderConfigError(
            f"unknown node provider {name!r}",
            hint=f"valid providers: {', '.join(provider_names())}",
        )
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ProviderConfigError(
            f"node provider {name!r} cannot be loaded: {exc}",
            hint=f"install the missing package ({exc.name or 'see above'}) into gbroker's environment",
        ) from exc
    cls: type[Provider] = getattr(module, class_name)
    return cls


def from_name(name: str, **settings: Any) -> Provider:
    """Build the provider registered under ``name`` from its settings.

    Unknown settings are an error naming the accepted ones, so a typo in the
    configuration file does not silently fall back to a default.
    """
    return checked_class(name, settings)(**settings)


def checked_class(name: str, settings: dict[str, Any]) -> type[Provider]:
    """The class registered under ``name``, once ``settings`` name only what it accepts
    and everything it needs (``gbroker config check`` stops here: nothing is built)."""
    cls = provider_class(name)
    params = inspect.signature(cls.__init__).parameters
    accepted = [p for p in params if p != "self"]
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    unknown = sorted(set(settings) - set(accepted))
    missing = sorted(
        p.name for p in params.values()
        if p.name != "self"
        and p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        and p.name not in settings
    )
    if (unknown and not takes_any) or missing:
        problems = []
        if unknown and not takes_any:
            problems.append(f"unknown setting(s) {', '.join(unknown)}")
        if missing:
            problems.append(f"missing setting(s) {', '.join(missing)}")
        raise ProviderConfigError(
            f"bad settings for node provider {name!r}: {'; '.join(problems)}",
            hint=f"accepted settings: {', '.join(accepted)}",
        )
    return cls
