"""Which pools can hold a job's request, and why the others cannot.

A researcher asks in GPUs, not partitions: a GPU type or several (any of
them), memory per GPU, CPUs and memory per GPU, GPUs per node and nodes.
``fits`` answers for one pool with None (it fits) or the reason it does not;
``fitting`` splits a catalog. Pure and standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from broker.pools.catalog import Pool


@dataclass(frozen=True)
class GpuRequest:
    """What a job asks of the capacity it runs on (per node unless said)."""

    gpus_per_node: int = 1
    nodes: int = 1
    gpu_types: tuple[str, ...] = ()
    """Any of these gres types; empty: any type."""
    gpu_mem_gb: int | None = None
    """At least this much memory per GPU."""
    cpus_per_node: int | None = None
    mem_per_node_mb: int | None = None
    interruptible: bool = True


def fits(pool: Pool, req: GpuRequest, max_nodes: int | None = None) -> str | None:
    """None when ``pool`` can hold ``req``, else why not (one short sentence)."""
    if req.gpu_types and (pool.gpu_type or "").lower() not in {t.lower() for t in req.gpu_types}:
        # Any spelling of the type: sbatch is given the pool's own (gres_type_for).
        have = pool.gpu_type or "untyped GPUs"
        return f"has {have}, the job asks for {' or '.join(req.gpu_types)}"
    if req.gpu_mem_gb is not None:
        if pool.gpu_mem_gb is None:
            return f"its GPU memory is not declared (gpu_mem_gb), the job needs {req.gpu_mem_gb} GB per GPU"
        if pool.gpu_mem_gb < req.gpu_mem_gb:
            return f"{pool.gpu_mem_gb} GB per GPU, the job needs {req.gpu_mem_gb} GB"
    if pool.gpus_per_node is not None and req.gpus_per_node > pool.gpus_per_node:
        return f"{pool.gpus_per_node} GPUs per node, the job asks for {req.gpus_per_node}"
    if req.cpus_per_node is not None and pool.cpus_per_node is not None and req.cpus_per_node > pool.cpus_per_node:
        return f"{pool.cpus_per_node} CPUs per node, the job asks for {req.cpus_per_node}"
    if (req.mem_per_node_mb is not None and pool.mem_per_node_gb is not None
            and req.mem_per_node_mb > pool.mem_per_node_gb * 1024):
        return f"{pool.mem_per_node_gb} GB of memory per node, the job asks for {-(-req.mem_per_node_mb // 1024)} GB"
    if max_nodes is not None and req.nodes > max_nodes:
        return f"{max_nodes} nodes, the job asks for {req.nodes}"
    return None


def fitting(pools: Iterable[Pool], req: GpuRequest,
            nodes_of: dict[str, int] | None = None) -> tuple[list[Pool], dict[str, str]]:
    """(pools that fit, in catalog order; pool name -> why each other one does not).

    ``nodes_of``: nodes per pool, where known (a pool with fewer than the job's nodes cannot hold it).
    """
    ok: list[Pool] = []
    why: dict[str, str] = {}
    for p in pools:
        reason = fits(p, req, (nodes_of or {}).get(p.name))
        if reason is None:
            ok.append(p)
        else:
            why[p.name] = reason
    return ok, why


def refusal(why: dict[str, str]) -> str:
    """The message for a job no pool can hold: each pool and why."""
    return "no pool can hold this job: " + "; ".join(f"{name}: {reason}" for name, reason in why.items())
