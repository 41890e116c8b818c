"""`gbroker pools`: the pool catalog with free and busy GPUs, prices and observed reclaim rates."""

from __future__ import annotations

import click

from broker.cli.main import Context
from broker.cli.output import print_json, print_table

pass_ctx = click.make_pass_decorator(Context)


def _n(value: object) -> str:
    return "?" if value is None else str(value)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_ctx
def pools(ctx: Context, as_json: bool) -> None:
    """The capacity pools jobs are placed on (docs/POOLS.md).

    Each pool: its Slurm partition, class (owned, reserved, spot, ondemand),
    GPU type and memory, zone, GPUs free and busy at the daemon's last node
    tick, price per GPU-hour, billing, and for spot pools the reclaims per
    hour seen in the last 7 days. '?' means not observed yet.
    """
    data = ctx.call("pools")
    if as_json:
        print_json(data)
        return
    rows = []
    for p in data["pools"]:
        gpu = p["gpu_type"] or "gpu"
        if p["gpu_mem_gb"]:
            gpu += f" {p['gpu_mem_gb']}GB"
        rate = "" if p["capacity"] != "spot" else _n(p["reclaims_per_hour"])
        rows.append((p["name"], p["partition"], p["capacity"], gpu, p["zone"] or "-", _n(p["free_gpus"]),
                     _n(p["busy_gpus"]), p["price"] or "?", p["billing"], rate))
    print_table(rows, ["POOL", "PARTITION", "CLASS", "GPU", "ZONE", "FREE GPUS", "BUSY GPUS", "PRICE/GPU-H",
                       "BILLING", "RECLAIMS/H"])
    if not data["catalog"]:
        click.echo("(two pools from [partitions]; declare [pools.<name>] tables for owned nodes, GPU types and "
                   "zones: docs/POOLS.md)")
