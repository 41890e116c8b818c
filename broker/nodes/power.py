"""Powering nodes up and down: the steps the daemon and Slurm's hooks share.

Slurm's ResumeProgram and SuspendProgram run ``gbroker node resume|suspend|
resume-fail HOSTLIST``. Normally the CLI hands the names to the daemon, whose
node manager (``broker.nodes.manager``) records sessions and events around
these steps. When the daemon does not answer, the CLI takes the same steps
itself (:func:`resume_unattended`, :func:`suspend_unattended`) and appends
what it did to the node journal, which the daemon ingests on its next tick:

* :func:`read_facts`: what Slurm says of the nodes (partitions, GPUs), from
  which the provider requests are made (``hooks.targets``);
* :func:`launch`: ask the provider for instances; what it could not launch
  comes back per node, with the reason;
* :func:`fail_nodes`: mark the nodes whose resume failed DOWN with a reason,
  so the jobs waiting for them go elsewhere.

No ORM here: the CLI imports this module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from broker.config import Settings
from broker.errors import SlurmError
from broker.nodes.providers import hooks
from broker.nodes.providers.base import Instance, NodeRequest, Provider, ProviderError, ResumeIncomplete
from broker.nodes.slurm import NodeSlurm
from broker.slurm.backend import Backend

RESUME_FAILED_REASON = "gbroker: resume failed"
"""The reason Slurm shows on a node marked DOWN because its resume failed."""

FactsWarning = Callable[[SlurmError], None]
"""Told when Slurm could not be read (the nodes then get the default partition)."""
DownWarning = Callable[[list[str], SlurmError], None]
"""Told when the nodes could not be marked DOWN."""


def read_facts(backend: Backend, names: Iterable[str], warn: FactsWarning) -> dict[str, hooks.NodeFacts]:
    """Partitions and GPUs of ``names`` as Slurm knows them (one sinfo); {} when Slurm cannot be read."""
    try:
        infos = {n.name: n for n in backend.nodes()}
    except SlurmError as exc:
        warn(exc)
        return {}
    return {n: hooks.NodeFacts(tuple(infos[n].partitions), infos[n].gpus) for n in names if n in infos}


def launch(provider: Provider, requests: Sequence[NodeRequest]) -> tuple[list[Instance], dict[str, str]]:
    """The provider's resume: the instances there are now, and why each node that got none did not."""
    try:
        return provider.resume(list(requests)), {}
    except ResumeIncomplete as exc:
        return exc.instances, {n: e.message for n, e in exc.failures.items()}
    except ProviderError as exc:
        return [], {r.name: exc.message for r in requests}


def fail_nodes(slurm: NodeSlurm, names: list[str], warn: DownWarning) -> None:
    """Jobs waiting for these nodes must go elsewhere: DOWN with a reason says why."""
    try:
        slurm.set_state(names, "DOWN", RESUME_FAILED_REASON)
    except SlurmError as exc:
        warn(names, exc)


# --------------------------------------------------------------------------- without the daemon


def resume_unattended(
    settings: Settings, provider: Provider, backend: Backend, names: list[str], key: str, at: datetime, *,
    facts_warn: FactsWarning, down_warn: DownWarning,
) -> dict[str, Any]:
    """ResumeProgram with the daemon down: launch, journal every node's outcome, fail the failed."""
    targets = hooks.targets(settings, names, read_facts(backend, names, facts_warn))
    instances, failures = launch(provider, [t.request for t in targets])
    by_node = {i.node_name: i.instance_id for i in instances}
    records = [
        {"name": t.request.name, "partition": t.request.partition, "capacity": t.request.capacity.value,
         "gpus": t.gpus, "instance_id": by_node.get(t.request.name), "error": failures.get(t.request.name)}
        for t in targets
    ]  # fmt: skip
    hooks.append_journal(settings.node_journal, hooks.journal_record("resume", at, records, key))
    if failures:
        fail_nodes(NodeSlurm(backend), sorted(failures), down_warn)
    return {"resumed": by_node, "failed": failures}


def suspend_unattended(
    settings: Settings, provider: Provider, action: str, names: list[str], key: str, at: datetime
) -> dict[str, Any]:
    """SuspendProgram or ResumeFailProgram (``action``) with the daemon down: terminate, then journal.

    A provider error propagates: nothing was terminated, so nothing is journaled.
    """
    provider.suspend(names)
    hooks.append_journal(settings.node_journal, hooks.journal_record(action, at, [{"name": n} for n in names], key))
    return {"suspended": names}
