"""What Slurm's ResumeProgram/SuspendProgram need, shared by the daemon and the CLI.

The hooks run ``gbroker node resume|suspend|resume-fail HOSTLIST``. Normally the
CLI hands the names to the daemon, which records the node events and calls the
provider. When the daemon is down the CLI calls the provider itself and
appends what it did to the node journal; the daemon ingests the journal on its
next tick, so a hook never fails because the daemon is down and no billing
event is lost.

Standard library plus the provider base only: the CLI imports this module.

Journal format: one JSON object per line, appended under an exclusive lock
and fsynced::

    {"id": "<32 hex>", "action": "resume"|"suspend"|"resume_fail",
     "at": "2026-09-01T12:00:00+00:00",
     "nodes": [{"name": "spot1", "partition": "spot", "capacity": "spot", "gpus": 4,
                "instance_id": "i-0abc" | null, "error": null | "why it failed"}]}

The ``id`` makes ingestion idempotent: a line applied once is never applied again.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from broker.config import Settings
from broker.nodes.providers.base import NodeRequest, Provider, ProviderConfigError, from_name
from broker.slurm.hostlist import count, expand

ACTIONS = ("resume", "suspend", "resume_fail")
INGESTING_SUFFIX = ".ingesting"


def new_key() -> str:
    """A fresh idempotency key for one hook call."""
    return uuid.uuid4().hex


NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""A node name as it may reach a provider's command line (never an option such as --x=y)."""
MAX_NODES_PER_CALL = 10_000
"""Nodes one hook call or request may name; checked before any hostlist is expanded."""


def expand_hostlists(args: Iterable[str], limit: int = MAX_NODES_PER_CALL) -> list[str]:
    """``["spot[1-2]", "od1"]`` -> ``["spot1", "spot2", "od1"]`` (order kept, no duplicates).

    More than ``limit`` names in all is refused before anything is expanded.
    """
    names: list[str] = []
    args = list(args)
    try:
        total = sum(count(arg) for arg in args)
    except ValueError as exc:
        raise ProviderConfigError(f"cannot read hostlist: {exc}",
                                  hint="pass node names or a Slurm hostlist such as spot[1-4]") from None
    if total > limit:
        raise ProviderConfigError(f"too many nodes in one call ({total}, at most {limit})",
                                  hint="split the hostlist")
    for arg in args:
        try:
            names.extend(expand(arg))
        except ValueError as exc:
            raise ProviderConfigError(
                f"cannot read hostlist {arg!r}: {exc}", hint="pass node names or a Slurm hostlist such as spot[1-4]"
            ) from None
    for name in names:
        if not NODE_NAME.fullmatch(name):
            raise ProviderConfigError(
                f"{name[:80]!r} is not a node name",
                hint="node names are up to 64 letters, digits, '.', '_' and '-', starting with a letter or digit "
                     "(they are passed to the site's resume and suspend commands)")
    return list(dict.fromkeys(names))


@dataclass(frozen=True)
class NodeFacts:
    """What Slurm says about a node that the provider needs."""

    partitions: tuple[str, ...]
    gpus: int = 0


@dataclass(frozen=True)
class Target:
    """One node to act on: the request for the provider plus what billing needs."""

    request: NodeRequest
    gpus: int


def home_partition(settings: Settings, partitions: Iterable[str]) -> str:
    """The managed partition a node is billed and launched under: the first managed
    one in configuration order, else the node's first partition, else the on-demand one."""
    parts = list(partitions)
    managed = list(settings.managed_node_partitions())
    for p in managed:
        if p in parts:
            return p
    return parts[0] if parts else settings.ondemand_partition


def targets(
    settings: Any, names: Iterable[str], facts: Mapping[str, NodeFacts], generation: Mapping[str, str] | None = None
) -> list[Target]:
    """Provider requests for ``names``: partition, capacity and instance type from the settings."""
    out = []
    rules = settings.managed_node_partitions()
    for name in names:
        fact = facts.get(name, NodeFacts(()))
        part = home_partition(settings, fact.partitions)
        rule = rules.get(part)
        out.append(
            Target(
                NodeRequest(
                    name=name,
                    partition=part,
                    capacity=settings.node_capacity(part),
                    instance_type=rule.instance_type if rule else None,
                    generation=(generation or {}).get(name),
                ),
                fact.gpus,
            )
        )
    return out


def make_provider(settings: Settings) -> Provider:
    """The provider named by ``node_provider`` with its ``[providers.<name>]`` settings."""
    if not settings.node_provider:
        raise ProviderConfigError(
            "no node provider is configured, so nodes cannot be resumed or suspended",
            hint="set node_provider (local, aws or command) and its [providers.<name>] table; see docs/NODES.md",
        )
    return from_name(settings.node_provider, **settings.provider_settings())


# --------------------------------------------------------------------------- journal


def journal_record(action: str, at: datetime, nodes: list[dict[str, Any]], key: str | None = None) -> dict[str, Any]:
    if action not in ACTIONS:
        raise ValueError(f"unknown journal action {action!r}")
    return {"id": key or new_key(), "action": action, "at": at.isoformat(), "nodes": nodes}


def append_journal(path: str | os.PathLike[str], record: Mapping[str, Any]) -> None:
    """Append one record durably (lock, write, fsync). Root-only file: it feeds billing."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    while True:
        fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                same = os.fstat(fd).st_ino == os.stat(p).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                continue  # the daemon moved the file aside while we waited: write to the new one
            os.write(fd, line)
            os.fsync(fd)
            return
        finally:
            os.close(fd)


def take_journal(path: str | os.PathLike[str]) -> tuple[Path | None, list[dict[str, Any]]]:
    """Move the journal aside and return (that file, its records) for ingestion.

    A file left aside by an ingestion that crashed is taken first (its records
    come back; applying them again is a no-op thanks to their ids). Call
    :func:`finish_journal` once the records are committed. Unreadable lines are
    skipped and kept in ``<journal>.bad`` for a human.
    """
    p = Path(path)
    aside = p.with_name(p.name + INGESTING_SUFFIX)
    if not aside.exists():
        if not p.exists():
            return None, []
        # The lock makes sure no hook is half-way through a line when we move it.
        fd = os.open(p, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.replace(p, aside)
        finally:
            os.close(fd)
    records: list[dict[str, Any]] = []
    bad: list[str] = []
    for line in aside.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            if rec.get("action") not in ACTIONS or not isinstance(rec.get("nodes"), list) or not rec.get("id"):
                raise ValueError("not a node journal record")
            datetime.fromisoformat(rec["at"])
            records.append(rec)
        except (ValueError, TypeError, KeyError, AttributeError):
            bad.append(line)
    if bad:
        with open(p.with_name(p.name + ".bad"), "a") as fh:
            fh.write("\n".join(bad) + "\n")
    return aside, records


def finish_journal(aside: Path | None) -> None:
    if aside is not None:
        aside.unlink(missing_ok=True)
